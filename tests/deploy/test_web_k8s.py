"""The web dashboard's component (k8s/components/web), added to an overlay as
docs/operations/kubernetes.md says: the overlay renders with `kubectl kustomize` and passes
`kubernetes-validate --strict`; `dispatcher web` runs in a locked-down Deployment of its own on
0.0.0.0 behind the token of the secret dispatcher-web (never --insecure), read-only unless the
documented patch turns actions on, probed on /healthz and /readyz, behind a ClusterIP Service that
selects its pods alone; and the Dockerfile builds its image with the `web` extra only when asked."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import K8S, OVERLAYS, WEB_IMAGE, documents, one, render
from tests.deploy.test_k8s import (
    KUBERNETES_VERSIONS,
    WORKER_SECRET,
    assert_locked_down,
    settings_map,
    validate,
    workers,
)

COMPONENT = K8S / "components" / "web"
WEB_SECRET_EXAMPLE = K8S / "web-secret.example.yaml"
DOCS = K8S.parent / "docs" / "operations" / "kubernetes.md"
WEB = "dispatcher-web"  # the Deployment, the Service and the token's secret
WEB_SECRET_KEY = "token"
SESSION_SECRET_KEY = "session-secret"
WEB_TAG = "0.1.0"
HTTP_PORT = 8080
# The overlay patch of the docs and the component's comment that turns the action buttons on.
ALLOW_ACTIONS_PATCH = (
    '[{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--allow-actions"}]'
)

Render = Callable[[str], list[dict[str, Any]]]


def with_web(root: Path, overlay: str, patches: list[dict[str, Any]] | None = None) -> str:
    """OVERLAY with the component and its image added as the docs say, in a copy of k8s/ under
    ROOT (the overlay refers to the component by a path inside the tree), rendered."""
    tree = root / "k8s"
    shutil.copytree(K8S, tree)
    path = tree / "overlays" / overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization.setdefault("components", []).append("../../components/web")
    kustomization["images"].append({"name": WEB_IMAGE, "newName": WEB_IMAGE, "newTag": WEB_TAG})
    kustomization.setdefault("patches", []).extend(patches or [])
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return render(tree / "overlays" / overlay)


_texts: dict[str, str] = {}


@pytest.fixture(scope="module")
def rendered_text(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    def text(overlay: str) -> str:
        if overlay not in _texts:  # one render per overlay and test session
            _texts[overlay] = with_web(tmp_path_factory.mktemp(overlay), overlay)
        return _texts[overlay]

    return text


@pytest.fixture(scope="module")
def rendered(rendered_text: Callable[[str], str]) -> Render:
    return lambda overlay: documents(rendered_text(overlay))


def web_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = one(docs, "Deployment", WEB)["spec"]["template"]["spec"]["containers"]
    return only


def argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def option(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} once in {args}"
    return args[args.index(name) + 1]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_with_the_web_component_are_valid_kubernetes(
    overlay: str, version: str, rendered_text: Callable[[str], str], tmp_path: Path
) -> None:
    path = tmp_path / f"{overlay}-web.yaml"
    path.write_text(rendered_text(overlay))
    done = validate(path, version)
    assert done.returncode == 0, (
        f"{overlay} + web against Kubernetes {version}:\n{done.stdout}{done.stderr}"
    )


def test_the_dashboard_serves_all_interfaces_behind_the_secret_token(rendered: Render) -> None:
    docs = rendered("partitioned-postgres")
    container = web_container(docs)
    args = argv(container)
    assert args[:2] == ["dispatcher", "web"], args
    assert option(args, "--host") == "0.0.0.0", "reachable through its Service"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(option(args, "--port")) == ports["http"] == HTTP_PORT
    # Never without the token: no --insecure, in any spelling, nor an env var of that name.
    assert not [a for a in args if "insecure" in a.lower()], args
    env = env_of(container)
    assert not [name for name in env if "INSECURE" in name], sorted(env)
    # The token from the secret, by reference: never a literal in the manifest or the ConfigMap.
    assert env["DISPATCHER_WEB_TOKEN"] == {
        "name": "DISPATCHER_WEB_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": WEB, "key": WEB_SECRET_KEY}},
    }
    assert "DISPATCHER_WEB_TOKEN" not in settings_map(docs)["data"]
    # The session secret from the same Secret: every replica signs and checks logins alike.
    assert env["DISPATCHER_WEB_SESSION_SECRET"] == {
        "name": "DISPATCHER_WEB_SESSION_SECRET",
        "valueFrom": {"secretKeyRef": {"name": WEB, "key": SESSION_SECRET_KEY}},
    }
    assert "DISPATCHER_WEB_SESSION_SECRET" not in settings_map(docs)["data"]
    # Read-only as shipped.
    assert "--allow-actions" not in args and "DISPATCHER_WEB_ALLOW_ACTIONS" not in env
    assert "DISPATCHER_WEB_ALLOW_ACTIONS" not in settings_map(docs)["data"]
    # The workers' settings (the same generated ConfigMap) and their DML-only role.
    assert container["envFrom"] == [
        {"configMapRef": {"name": settings_map(docs)["metadata"]["name"]}},
        {"secretRef": {"name": WORKER_SECRET}},
    ]
    # Its own image, set by the overlay's `images:`; the workers' stays without the web extra.
    assert container["image"] == f"{WEB_IMAGE}:{WEB_TAG}"
    worker_images = {c["image"] for c in workers(docs)["spec"]["template"]["spec"]["containers"]}
    assert container["image"] not in worker_images


def test_the_dashboard_is_probed_on_healthz_and_readyz(rendered: Render) -> None:
    container = web_container(rendered("partitioned-postgres"))
    assert [p["name"] for p in container["ports"]] == ["http"]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = container[probe]["httpGet"]
        # No token: the probes send no header.
        assert get == {"path": path, "port": "http"}, f"{probe}: {get}"


def test_the_dashboard_pod_is_locked_down_and_stops_quickly(rendered: Render) -> None:
    docs = rendered("partitioned-postgres")
    web = one(docs, "Deployment", WEB)
    spec = web["spec"]["template"]["spec"]
    assert_locked_down(f"Deployment/{WEB}", spec)
    # The server stops within 5 s of SIGTERM; the kubelet need not wait a worker's 45 s.
    assert 5 < spec["terminationGracePeriodSeconds"] <= 15, spec["terminationGracePeriodSeconds"]
    # One replica as shipped; logins are signed, so more may run (docs/operations/kubernetes.md).
    assert web["spec"]["replicas"] == 1
    # The base's account, which mounts no token.
    account = one(docs, "ServiceAccount", spec["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_dashboard_is_a_workload_of_its_own(overlay: str, rendered: Render) -> None:
    """In every overlay (the static one's Deployment-to-StatefulSet patch included): the web
    Deployment stays one, no other pod runs `dispatcher web`, the workers' Service and budget do not
    select it, and its Service selects it alone, on port 8080."""
    docs = rendered(overlay)
    web = one(docs, "Deployment", WEB)
    worker = workers(docs)  # exactly one worker workload: the web one carries no worker label
    assert worker["metadata"]["name"] != WEB
    web_labels = web["spec"]["template"]["metadata"]["labels"]
    assert web_labels["app.kubernetes.io/component"] == "web"
    assert web["spec"]["selector"]["matchLabels"].items() <= web_labels.items()
    others = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job") and d is not web]
    assert others, "the overlay's workloads"
    for workload in others:
        spec = workload["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert argv(container)[:2] != ["dispatcher", "web"], (
                f"{workload['metadata']['name']} runs the dashboard"
            )
    for kind, name in (("Service", "dispatcher-metrics"), ("PodDisruptionBudget", "dispatcher")):
        found = one(docs, kind, name)
        selector = found["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert not selector.items() <= web_labels.items(), f"{kind}/{name} selects the dashboard"
    service = one(docs, "Service", WEB)
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service["spec"]["selector"].items() <= web_labels.items()
    for workload in others:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert not service["spec"]["selector"].items() <= labels.items(), workload["metadata"][
            "name"
        ]
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (HTTP_PORT, "http")


def test_the_documented_patch_turns_the_actions_on(tmp_path: Path) -> None:
    assert ALLOW_ACTIONS_PATCH in DOCS.read_text(), "docs/operations/kubernetes.md shows the patch"
    assert ALLOW_ACTIONS_PATCH in (COMPONENT / "kustomization.yaml").read_text(), (
        "so does the component"
    )
    text = with_web(
        tmp_path,
        "partitioned-postgres",
        [{"target": {"kind": "Deployment", "name": WEB}, "patch": ALLOW_ACTIONS_PATCH}],
    )
    args = argv(web_container(documents(text)))
    assert "--allow-actions" in args and option(args, "--host") == "0.0.0.0", args
    (tmp_path / "out.yaml").write_text(text)
    done = validate(tmp_path / "out.yaml", KUBERNETES_VERSIONS[-1])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_web_secret_example_holds_the_token_and_session_secret_the_pod_reads(
    version: str, rendered: Render
) -> None:
    done = validate(WEB_SECRET_EXAMPLE, version)
    assert done.returncode == 0, done.stdout + done.stderr
    (secret,) = documents(WEB_SECRET_EXAMPLE.read_text())
    env = env_of(web_container(rendered("partitioned-postgres")))
    refs = [
        env[name]["valueFrom"]["secretKeyRef"]
        for name in ("DISPATCHER_WEB_TOKEN", "DISPATCHER_WEB_SESSION_SECRET")
    ]
    assert {ref["name"] for ref in refs} == {secret["metadata"]["name"]}
    assert secret["kind"] == "Secret"
    assert list(secret["stringData"]) == [ref["key"] for ref in refs]
    assert "secrets.token_urlsafe(32)" in WEB_SECRET_EXAMPLE.read_text(), "how to make one"


def test_the_docs_walk_through_the_deployment(rendered: Render) -> None:
    text = DOCS.read_text()
    service = one(rendered("partitioned-postgres"), "Service", WEB)
    assert f"kubectl port-forward svc/{service['metadata']['name']} {HTTP_PORT}" in text
    assert "--build-arg EXTRAS=web" in text
    assert "../../components/web" in text and f"name: {WEB_IMAGE}" in text
    assert "](../guides/dashboard.md)" in text


def test_the_dockerfile_installs_the_web_extra_only_when_asked() -> None:
    """`ARG EXTRAS` (empty by default) adds extras to `pip install`: the workers' image is
    built without it, the dashboard's with `--build-arg EXTRAS=web`. Every image has `binary`
    (psycopg's libpq: the slim image has none) and `redis` (one image for every overlay). The
    install word is expanded by sh as the build's RUN does."""
    text = (K8S.parent / "Dockerfile").read_text()
    build = re.split(r"(?m)^FROM ", text)[1:][0]
    assert re.search(r'(?m)^ARG EXTRAS=""$', build), "no extras by default"
    (word,) = re.findall(r'(?m)^RUN pip install ("?\.\S*) ', build)  # the project's, not -r
    assert build.index('ARG EXTRAS=""') < build.index(f"RUN pip install {word}")
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh to expand the install word")
    for extras, expected in (
        ("", ".[binary,redis]"),
        ("web", ".[binary,redis,web]"),
        ("web,bench", ".[binary,redis,web,bench]"),
    ):
        done = subprocess.run(
            [sh, "-c", f"printf %s {word}"],
            env={"EXTRAS": extras},
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        assert done.stdout == expected, (extras, done.stdout)
