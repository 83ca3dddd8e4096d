"""The autoscaling component (k8s/components/keda), added to an overlay as
docs/operations/autoscaling.md says: the overlay renders with `kubectl kustomize`; its built-in
kinds pass `kubernetes-validate --strict` and its KEDA objects, which no schema there knows, are
checked field by field (and the HPA behavior they carry is validated strictly as the HPA KEDA makes
of it); the ScaledObject scales the worker Deployment on a query of the fleet's own queues (copied
from the settings ConfigMap) through the claim index, capped at maxReplicaCount x targetQueryValue,
with the workers' secret; the static overlay refuses it; and no shipped overlay but static sets the
workers' replica count, so `kubectl apply` never fights the autoscaler.

tests/integration/test_keda_query.py runs the rendered query on a real database."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.settings.meta import parse_queues
from tests.deploy.support import K8S, OVERLAYS, documents, find, kubectl, one, render, run
from tests.deploy.test_k8s import (
    KUBERNETES_VERSIONS,
    WORKER_SECRET,
    kustomization,
    settings_map,
    validate,
    workers,
)

COMPONENT = K8S / "components" / "keda"
DOCS = K8S.parent / "docs" / "operations" / "autoscaling.md"
SCALED = ("partitioned-postgres", "partitioned-redis", "skip-locked")  # the Deployment overlays
KEDA_API = "keda.sh/v1alpha1"
DSN_KEY = "DISPATCHER_DSN"
# The fields of KEDA's CRDs these manifests may use (keda.sh/docs/2.15/reference/scaledobject-spec,
# .../scalers/postgresql, .../concepts/authentication): a misspelt one is refused here, as the
# API server's structural schema would prune or refuse it.
SCALED_OBJECT_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
TRIGGER_FIELDS = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
POSTGRESQL_METADATA = {
    "query",
    "targetQueryValue",
    "activationTargetQueryValue",
    "connectionFromEnv",
    "host",
    "port",
    "userName",
    "dbName",
    "sslmode",
    "passwordFromEnv",
}
ADVANCED_FIELDS = {
    "restoreToOriginalReplicaCount",
    "horizontalPodAutoscalerConfig",
    "scalingModifiers",
}
QUEUES_QUOTE = "$queues$"
_QUEUES = re.compile(re.escape(QUEUES_QUOTE) + r"(.*?)" + re.escape(QUEUES_QUOTE), re.DOTALL)
_LIMIT = re.compile(r"\bLIMIT\s+(\d+)\b")

Render = Callable[[str], list[dict[str, Any]]]


def with_keda(root: Path, overlay: str, queues: str | None = None) -> str:
    """OVERLAY with the component added as the docs say, in a copy of k8s/ under ROOT (the overlay
    refers to it by a path inside the tree), rendered; `queues`: the overlay also merges
    DISPATCHER_QUEUES=queues into the settings, as a fleet serving other queues would."""
    tree = root / "k8s"
    shutil.copytree(K8S, tree)
    path = tree / "overlays" / overlay / "kustomization.yaml"
    data = yaml.safe_load(path.read_text())
    data.setdefault("components", []).append("../../components/keda")
    if queues is not None:
        generator = next(
            g for g in data["configMapGenerator"] if g["name"] == "dispatcher-settings"
        )
        generator["literals"].append(f"DISPATCHER_QUEUES={queues}")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return render(tree / "overlays" / overlay)


def scaled_object(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ScaledObject", "dispatcher")


def trigger(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = scaled_object(docs)["spec"]["triggers"]
    return only


def query_of(docs: list[dict[str, Any]]) -> str:
    """The scaler's SQL, exactly as KEDA will send it."""
    return str(trigger(docs)["metadata"]["query"])


def queues_in(query: str) -> tuple[str, ...]:
    """The queue list of the query, split as the workers split DISPATCHER_QUEUES."""
    (text,) = _QUEUES.findall(query)
    return parse_queues(text)


def cap_of(query: str) -> int:
    (limit,) = _LIMIT.findall(query)
    return int(limit)


_texts: dict[tuple[str, str | None], str] = {}


@pytest.fixture(scope="module")
def rendered_text(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    def text(overlay: str, queues: str | None = None) -> str:
        if (overlay, queues) not in _texts:  # one render per case and test session
            _texts[overlay, queues] = with_keda(tmp_path_factory.mktemp(overlay), overlay, queues)
        return _texts[overlay, queues]

    return text


@pytest.fixture(scope="module")
def rendered(rendered_text: Callable[..., str]) -> Render:
    return lambda overlay: documents(rendered_text(overlay))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", SCALED)
def test_overlays_with_the_keda_component_are_valid_kubernetes(
    overlay: str, version: str, rendered_text: Callable[..., str], tmp_path: Path
) -> None:
    """The built-in kinds strictly; kubernetes-validate skips the KEDA kinds (no schema), which
    the tests below check field by field."""
    path = tmp_path / f"{overlay}-keda.yaml"
    path.write_text(rendered_text(overlay))
    done = validate(path, version)
    assert done.returncode == 0, (
        f"{overlay} + keda against Kubernetes {version}:\n{done.stdout}{done.stderr}"
    )


@pytest.mark.parametrize("overlay", SCALED)
def test_the_keda_objects_use_only_fields_keda_knows(overlay: str, rendered: Render) -> None:
    docs = rendered(overlay)
    obj = scaled_object(docs)
    assert obj["apiVersion"] == KEDA_API
    assert set(obj["spec"]) <= SCALED_OBJECT_FIELDS, sorted(set(obj["spec"]) - SCALED_OBJECT_FIELDS)
    assert set(obj["spec"]["advanced"]) <= ADVANCED_FIELDS
    assert set(obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]) <= {"name", "behavior"}
    assert set(obj["spec"]["fallback"]) == {"failureThreshold", "replicas"}
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(obj["spec"][field], int) and not isinstance(obj["spec"][field], bool), (
            field
        )
    found = trigger(docs)
    assert set(found) <= TRIGGER_FIELDS, sorted(set(found) - TRIGGER_FIELDS)
    assert found["type"] == "postgresql" and found["useCachedMetrics"] is True
    metadata = found["metadata"]
    assert set(metadata) <= POSTGRESQL_METADATA, sorted(set(metadata) - POSTGRESQL_METADATA)
    # The CRD's metadata is map[string]string: a YAML number there is refused by the API server.
    assert all(isinstance(v, str) for v in metadata.values()), metadata
    # The connection is the TriggerAuthentication's, never a literal or a plain-text host here.
    assert not set(metadata) & {"connectionFromEnv", "host", "userName", "passwordFromEnv"}
    auth = one(docs, "TriggerAuthentication", found["authenticationRef"]["name"])
    assert auth["apiVersion"] == KEDA_API
    assert (
        found["authenticationRef"].get("kind", "TriggerAuthentication") == "TriggerAuthentication"
    )
    assert set(auth["spec"]) == {"secretTargetRef"}


@pytest.mark.parametrize("overlay", SCALED)
def test_it_scales_the_worker_deployment_between_its_bounds(overlay: str, rendered: Render) -> None:
    docs = rendered(overlay)
    spec = scaled_object(docs)["spec"]
    worker = workers(docs)
    ref = spec["scaleTargetRef"]
    assert (
        (ref.get("apiVersion", "apps/v1"), ref.get("kind", "Deployment"), ref["name"])
        == (worker["apiVersion"], worker["kind"], worker["metadata"]["name"])
        == ("apps/v1", "Deployment", "dispatcher")
    )
    # 1 as shipped: with no worker, no reaper, pruner or schedule runs (the docs on scaling to
    # zero).
    assert 1 == spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    assert spec["pollingInterval"] <= 30
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # A burst scales up at once; a lull waits 5 minutes of agreeing readings and steps down slowly.
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert all(p["periodSeconds"] >= 60 for p in behavior["scaleDown"]["policies"])


def test_the_behavior_is_a_valid_autoscaling_v2_hpa(rendered: Render, tmp_path: Path) -> None:
    """KEDA copies `behavior`, the bounds and the target into the HPA it creates
    (keda-hpa-dispatcher): that HPA, strictly validated, catches a misspelt policy field."""
    spec = scaled_object(rendered("partitioned-postgres"))["spec"]
    config = spec["advanced"]["horizontalPodAutoscalerConfig"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": config.get("name", "keda-hpa-dispatcher")},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": spec["scaleTargetRef"]["name"],
            },
            "minReplicas": spec["minReplicaCount"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": config["behavior"],
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "s0-postgresql"},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": trigger(rendered("partitioned-postgres"))["metadata"][
                                "targetQueryValue"
                            ],
                        },
                    },
                }
            ],
        },
    }
    for version in KUBERNETES_VERSIONS:
        path = tmp_path / "hpa.yaml"
        path.write_text(yaml.safe_dump(hpa))
        done = validate(path, version)
        assert done.returncode == 0, f"against Kubernetes {version}:\n{done.stdout}{done.stderr}"
    hpa["spec"]["behavior"]["scaleDown"]["policies"][0]["periodSecond"] = 60
    path.write_text(yaml.safe_dump(hpa))
    done = validate(path, KUBERNETES_VERSIONS[-1])
    assert done.returncode != 0 and "periodSecond" in done.stdout + done.stderr, (
        done.stdout + done.stderr
    )


@pytest.mark.parametrize("overlay", SCALED)
def test_it_connects_with_the_workers_secret(overlay: str, rendered: Render) -> None:
    docs = rendered(overlay)
    auth = one(docs, "TriggerAuthentication", trigger(docs)["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "connection", "name": WORKER_SECRET, "key": DSN_KEY}
    ]
    # The secret the workers read their DSN from, and the key the example secret fills in.
    refs = [
        src
        for c in workers(docs)["spec"]["template"]["spec"]["containers"]
        for src in c.get("envFrom", [])
    ]
    assert {"secretRef": {"name": WORKER_SECRET}} in refs
    example = one(documents((K8S / "secret.example.yaml").read_text()), "Secret", WORKER_SECRET)
    assert DSN_KEY in example["stringData"]


@pytest.mark.parametrize("overlay", SCALED)
def test_the_query_counts_the_due_backlog_through_the_claim_index(
    overlay: str, rendered: Render
) -> None:
    docs = rendered(overlay)
    query = query_of(docs)
    # The claim index's predicate, tag included (migration 0003): without `priority > -32769` the
    # planner may not use dispatcher_jobs_claim_idx. Due only: the delayed jobs wait in it too.
    for condition in (
        "status = 'queued'",
        "priority > -32769",
        "run_at <= now()",
        "queue_name = ANY (",
        "queue_name <> ALL (ARRAY(SELECT queue_name FROM dispatcher_paused_queues))",
    ):
        assert condition in query, condition
    assert query.lstrip().startswith("SELECT count(*) FROM (") and query.rstrip().endswith(
        ") AS due"
    )
    # Capped: count at most what the largest fleet needs; more cannot change the replica count.
    spec = scaled_object(docs)["spec"]
    target = float(trigger(docs)["metadata"]["targetQueryValue"])
    assert cap_of(query) == spec["maxReplicaCount"] * target, (
        "LIMIT = maxReplicaCount x targetQueryValue"
    )
    assert float(trigger(docs)["metadata"]["activationTargetQueryValue"]) == 0, (
        "one due job wakes a fleet at zero"
    )
    # The fleet's own queues, as the workers read them from the ConfigMap.
    assert (
        queues_in(query)
        == parse_queues(str(settings_map(docs)["data"]["DISPATCHER_QUEUES"]))
        == ("default",)
    )


def test_the_query_follows_the_overlays_queues(rendered_text: Callable[..., str]) -> None:
    """An overlay that serves other queues (DISPATCHER_QUEUES merged into the ConfigMap) gets them
    in the query too: the replacement copies the merged value, spaces and all."""
    docs = documents(rendered_text("partitioned-postgres", "default, emails,reports"))
    assert settings_map(docs)["data"]["DISPATCHER_QUEUES"] == "default, emails,reports"
    query = query_of(docs)
    assert queues_in(query) == ("default", "emails", "reports")
    assert QUEUES_QUOTE + "default, emails,reports" + QUEUES_QUOTE in query


def test_the_static_overlay_refuses_the_component(tmp_path: Path) -> None:
    """Its N is fixed (pod i of N): with the component added, the render fails."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    path = tree / "overlays" / "static" / "kustomization.yaml"
    data = yaml.safe_load(path.read_text())
    data["components"] = ["../../components/keda"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    done = run([kubectl(), "kustomize", str(path.parent)])
    assert done.returncode != 0 and "/kind" in done.stderr, done.stdout + done.stderr
    assert not find(documents(render(K8S / "overlays" / "static")), "ScaledObject")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_static_overlay_sets_the_workers_replica_count(overlay: str) -> None:
    """A count in the manifests would be put back by every `kubectl apply`, over what KEDA, an
    HPA or `kubectl scale` chose. The static overlay's N is its configuration (pod i of N)."""
    docs = documents(render(K8S / "overlays" / overlay))
    worker = workers(docs)
    if overlay == "static":
        assert worker["spec"]["replicas"] == kustomization("static")["replicas"][0]["count"]
        return
    assert "replicas" not in worker["spec"], f"{overlay}: the worker Deployment sets replicas"
    assert not [
        r
        for r in kustomization(overlay).get("replicas", [])
        if r["name"] == worker["metadata"]["name"]
    ]


def test_the_docs_walk_through_autoscaling(rendered: Render) -> None:
    text = DOCS.read_text()
    assert "../../components/keda" in text
    assert "](autoscaling.md)" in (K8S.parent / "docs" / "operations" / "kubernetes.md").read_text()
    assert "](operations/autoscaling.md)" in (K8S.parent / "docs" / "README.md").read_text()
    # The query the docs explain is the one that ships (up to the queue list the render fills in).
    source = query_of(documents((COMPONENT / "scaledobject.yaml").read_text()))
    shipped = query_of(rendered("partitioned-postgres"))
    assert shipped == _QUEUES.sub(lambda _: QUEUES_QUOTE + "default" + QUEUES_QUOTE, source)
    assert shipped in text, "the docs show the query as it renders with DISPATCHER_QUEUES=default"
    assert "priority > -32769" in text and "Index Only Scan using dispatcher_jobs_claim_idx" in text
    for topic in (
        "minReplicaCount: 0",
        "rebalance",
        "stabilization",
        "kubectl apply edit-last-applied",
    ):
        assert topic in text, topic
