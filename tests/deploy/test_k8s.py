"""The Kubernetes manifests: every overlay renders with `kubectl kustomize`, passes
`kubernetes-validate --strict`, and has the properties docs/operations/kubernetes.md promises
(probes on the health endpoints, a locked-down securityContext, a grace period above the worker's
exit bound, the mode in the ConfigMap, the image set through `images:`, a per-release migration
Job on the owner secret)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.serve.worker import exit_bound_s
from dispatcher.settings.config import Config, settings
from tests.deploy.support import APP_IMAGE, K8S, OVERLAYS, documents, find, one, render, run

# Schemas to validate against: the oldest Kubernetes the manifests support (1.28: the static
# overlay reads the pod-index label) and the newest kubernetes-validate 1.37 ships (1.25 to 1.37).
KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")
WORKER_SECRET = "dispatcher-db"
OWNER_SECRET = "dispatcher-db-owner"
EXPECTED_SETTINGS = {
    "partitioned-postgres": {
        "DISPATCHER_MODE": "partitioned",
        "DISPATCHER_COORDINATOR": "postgres",
    },
    "partitioned-redis": {"DISPATCHER_MODE": "partitioned", "DISPATCHER_COORDINATOR": "redis"},
    "skip-locked": {"DISPATCHER_MODE": "skip_locked"},
    "static": {"DISPATCHER_MODE": "partitioned", "DISPATCHER_COORDINATOR": "static"},
}
WORKLOADS = ("Deployment", "StatefulSet", "Job")

_rendered: dict[str, str] = {}


def rendered(overlay: str) -> list[dict[str, Any]]:
    if overlay not in _rendered:  # one render per overlay and test session
        _rendered[overlay] = render(K8S / "overlays" / overlay)
    return documents(_rendered[overlay])


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in WORKLOADS
    ]


def workers(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one worker workload (Deployment, or the static overlay's StatefulSet)."""
    found = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def settings_map(docs: list[dict[str, Any]]) -> dict[str, Any]:
    maps = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("dispatcher-settings-")
    ]
    assert len(maps) == 1, "one generated dispatcher-settings-<hash> ConfigMap"
    return maps[0]


def kustomization(overlay: str) -> dict[str, Any]:
    return yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())


def validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the `test` extra")
    return run(
        [
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            "--kubernetes-version",
            version,
            "--quiet",
            str(path),
        ]
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_is_valid_kubernetes(overlay: str, version: str, tmp_path: Path) -> None:
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(render(K8S / "overlays" / overlay))
    done = validate(path, version)
    assert done.returncode == 0, (
        f"{overlay} against Kubernetes {version}:\n{done.stdout}{done.stderr}"
    )


def test_strict_validation_refuses_a_misspelt_field(tmp_path: Path) -> None:
    """The check above can fail: a probe with a field Kubernetes does not know is refused."""
    docs = rendered("partitioned-postgres")
    worker = workers(docs)
    worker["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = (
        "/readyz"
    )
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(worker))
    done = validate(path, KUBERNETES_VERSIONS[-1])
    assert done.returncode != 0 and "paht" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_example_secrets_are_valid(version: str) -> None:
    done = validate(K8S / "secret.example.yaml", version)
    assert done.returncode == 0, done.stdout + done.stderr
    names = {d["metadata"]["name"] for d in documents((K8S / "secret.example.yaml").read_text())}
    assert names == {WORKER_SECRET, OWNER_SECRET}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_probe_the_health_endpoints_on_the_metrics_port(overlay: str) -> None:
    docs = rendered(overlay)
    spec = workers(docs)["spec"]["template"]["spec"]
    port = str(settings_map(docs)["data"]["DISPATCHER_METRICS_PORT"])
    for container in spec["containers"]:
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert str(ports.get("metrics")) == port, (
            f"{container['name']}: port 'metrics' is not {port}"
        )
        for probe, path in (
            ("startupProbe", "/livez"),
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/readyz"),
        ):
            get = container[probe]["httpGet"]
            assert (get["path"], get["port"]) == (path, "metrics"), (
                f"{container['name']} {probe}: {get}"
            )
        # A liveness failure must wait out a slow start; the startup probe covers it.
        assert (
            container["startupProbe"]["failureThreshold"]
            * container["startupProbe"]["periodSeconds"]
            >= 60
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_locked_down(overlay: str) -> None:
    """Every pod the overlay runs, the migration Job's and Redis's included: non-root with a numeric
    uid, read-only root filesystem, no privilege escalation, no capabilities, RuntimeDefault
    seccomp, no service account token, requests and a memory limit, /tmp-style writable mounts only
    from emptyDir volumes."""
    for name, spec in pod_specs(rendered(overlay)):
        assert_locked_down(name, spec)


def assert_locked_down(name: str, spec: dict[str, Any]) -> None:
    """One pod spec of workload `name` (Kind/name): the checks above (the bench Job's too)."""
    pod_sc = spec.get("securityContext", {})
    assert spec.get("automountServiceAccountToken") is False, name
    # The Service dispatcher-metrics would inject DISPATCHER_METRICS_PORT=tcp://...: a setting.
    assert spec.get("enableServiceLinks") is False, name
    empty_dirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    for container in spec.get("initContainers", []) + spec["containers"]:
        where = f"{name} container {container['name']}"
        sc = {**pod_sc, **container.get("securityContext", {})}  # the container's fields win
        assert sc.get("runAsNonRoot") is True, where
        assert isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] > 0, (
            f"{where}: numeric non-root uid"
        )
        assert sc.get("readOnlyRootFilesystem") is True, where
        assert sc.get("allowPrivilegeEscalation") is False, where
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
        assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        resources = container.get("resources", {})
        assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{where}: requests"
        assert "memory" in resources.get("limits", {}), f"{where}: memory limit"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in empty_dirs, f"{where}: {mount['mountPath']} is not an emptyDir"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_outlasts_the_workers_exit_bound(overlay: str) -> None:
    docs = rendered(overlay)
    grace_s = float(settings_map(docs)["data"]["DISPATCHER_SHUTDOWN_GRACE_S"])
    bound_s = exit_bound_s(Config(shutdown_grace_s=grace_s).worker)
    assert bound_s >= grace_s + 6  # the docs' promise: grace + 6 s
    period_s = workers(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert period_s > bound_s, f"terminationGracePeriodSeconds {period_s} <= exit bound {bound_s} s"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_configmap_holds_the_mode_and_valid_settings(overlay: str) -> None:
    docs = rendered(overlay)
    config_map = settings_map(docs)
    data = {k: str(v) for k, v in config_map["data"].items()}
    for key, value in EXPECTED_SETTINGS[overlay].items():
        assert data.get(key) == value, f"{overlay}: {key}={data.get(key)!r}, expected {value!r}"
    known = {s.env_var for s in settings()}
    assert set(data) <= known, f"not settings: {sorted(set(data) - known)}"
    # Exactly what a worker pod would load (its DSN comes from the secret): no ConfigError.
    config = Config.load({**data, "DISPATCHER_DSN": "postgresql://app_worker@postgres/app"})
    assert config.wait_for_schema, "the workers wait for the migration Job"
    # The app is a setting like the others: `dispatcher run` takes it from the ConfigMap.
    assert config.worker.app == "myapp.jobs:registry"
    commands = [c["command"] for c in workers(docs)["spec"]["template"]["spec"]["containers"]]
    assert commands == [["dispatcher", "run"]], (
        "the settings, the app among them, come from the ConfigMap"
    )
    # The workers read it through envFrom under its generated (hashed) name, so a change rolls them.
    spec = workers(docs)["spec"]["template"]["spec"]
    refs = [src for c in spec["containers"] for src in c.get("envFrom", [])]
    assert {"configMapRef": {"name": config_map["metadata"]["name"]}} in refs
    assert {"secretRef": {"name": WORKER_SECRET}} in refs


def test_redis_overlay_points_the_workers_at_its_redis() -> None:
    docs = rendered("partitioned-redis")
    url = settings_map(docs)["data"]["DISPATCHER_REDIS_URL"]
    service = one(docs, "Service", "dispatcher-redis")
    assert url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    redis = one(docs, "Deployment", "dispatcher-redis")
    assert (
        service["spec"]["selector"].items()
        <= redis["spec"]["template"]["metadata"]["labels"].items()
    )
    assert redis["spec"]["strategy"]["type"] == "Recreate", "never two Redis servers at once"


def test_static_overlay_runs_a_statefulset_of_n_indexed_workers() -> None:
    docs = rendered("static")
    assert not find(docs, "Deployment"), "the static overlay replaces the Deployment"
    sts = one(docs, "StatefulSet", "dispatcher")
    data = settings_map(docs)["data"]
    assert int(data["DISPATCHER_WORKER_COUNT"]) == sts["spec"]["replicas"], (
        "N follows the replica count"
    )
    assert int(data["DISPATCHER_WORKER_COUNT"]) == kustomization("static")["replicas"][0]["count"]
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    assert (
        env["DISPATCHER_WORKER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert (
        sts["spec"]["serviceName"] == one(docs, "Service", "dispatcher-metrics")["metadata"]["name"]
    )
    assert sts["spec"]["podManagementPolicy"] == "Parallel"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_image_is_set_through_kustomize_images(overlay: str) -> None:
    entry = next(i for i in kustomization(overlay)["images"] if i["name"] == APP_IMAGE)
    image = f"{entry.get('newName', APP_IMAGE)}:{entry['newTag']}"
    for name, spec in pod_specs(rendered(overlay)):
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["name"] == "redis":
                assert not container["image"].endswith(":latest") and ":" in container["image"], (
                    container["image"]
                )
                continue
            assert container["image"] == image, f"{name} {container['name']}: {container['image']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migration_job_is_per_release_on_the_owner_secret(overlay: str) -> None:
    docs = rendered(overlay)
    tag = next(i for i in kustomization(overlay)["images"] if i["name"] == APP_IMAGE)["newTag"]
    job = one(docs, "Job")
    name = job["metadata"]["name"]
    assert name == f"dispatcher-migrate-{tag}", "a release's Job is named after its image tag"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", name), (
        f"{name}: not a valid Job name"
    )
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    spec = job["spec"]["template"]["spec"]
    steps = spec["initContainers"] + spec["containers"]
    assert [c["command"][:2] for c in steps] == [
        ["dispatcher", "migrate"],
        ["dispatcher", "grants"],
    ]
    assert "--apply" in steps[1]["command"]
    for container in steps:
        # Its own secret, and no ConfigMap: a settings change must not touch an existing Job
        # (its pod template cannot change).
        assert container["envFrom"] == [{"secretRef": {"name": OWNER_SECRET}}], container["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_service_and_disruption_budget_select_the_workers(overlay: str) -> None:
    docs = rendered(overlay)
    labels = workers(docs)["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service", "dispatcher-metrics")
    assert service["spec"]["selector"].items() <= labels.items()
    assert (
        service["spec"]["clusterIP"] == "None"
        and service["spec"]["publishNotReadyAddresses"] is True
    )
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    # Nothing else carries the worker labels: the Service and the budget count workers only.
    for name, _spec in pod_specs(docs):
        if name != f"{workers(docs)['kind']}/dispatcher":
            assert not service["spec"]["selector"].items() <= find_labels(docs, name).items(), name


def find_labels(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    kind, _, obj = name.partition("/")
    return one(docs, kind, obj)["spec"]["template"]["metadata"]["labels"]


def test_monitoring_components_render_and_point_at_the_workers(tmp_path: Path) -> None:
    """An overlay with the ServiceMonitor and the monitoring component (PrometheusRule,
    dashboard)."""

    def rel(path: Path) -> str:  # kustomize refuses absolute paths
        return os.path.relpath(path, tmp_path)

    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel(K8S / "overlays" / "partitioned-postgres")],
                "components": [rel(K8S / "components" / "servicemonitor"), rel(K8S / "monitoring")],
            }
        )
    )
    text = render(tmp_path)
    docs = documents(text)
    (tmp_path / "out.yaml").write_text(text)
    # the CRDs' kinds are skipped, with a warning
    done = validate(tmp_path / "out.yaml", KUBERNETES_VERSIONS[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service", "dispatcher-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    rule = one(docs, "PrometheusRule")
    assert {g["name"] for g in rule["spec"]["groups"]} == {
        "dispatcher.recording",
        "dispatcher.alerts",
    }
    dashboard = one(docs, "ConfigMap", "dispatcher-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "dispatcher.json" in dashboard["data"]


def test_dockerfile_runs_as_the_manifests_uid_without_compilers() -> None:
    """The example image's user is the pods' runAsUser, numeric; its final stage installs nothing
    (no compiler can reach it) and copies the virtualenv built in the first."""
    text = (K8S.parent / "Dockerfile").read_text()
    stages = re.split(r"(?m)^FROM ", text)[1:]
    assert len(stages) >= 2, "multi-stage"
    final = stages[-1]
    (user,) = re.findall(r"(?m)^USER (\S+)$", final)
    uid = one(rendered("partitioned-postgres"), "Deployment", "dispatcher")["spec"]["template"][
        "spec"
    ]["securityContext"]["runAsUser"]
    assert user == f"{uid}:{uid}", f"USER {user}, runAsUser {uid}"
    assert not re.search(r"apt-get|apk add|pip install|gcc|build-essential", final), (
        "the final stage builds nothing"
    )
    assert "COPY --from=build /opt/venv /opt/venv" in final
    assert re.search(r'(?m)^RUN pip install "?\.', stages[0]), (
        "the project itself (with EXTRAS, if any)"
    )
    ignored = (K8S.parent / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)
