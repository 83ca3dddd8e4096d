"""What the deployment tests share: the repository's k8s/ tree, rendering it with `kubectl
kustomize`, and the metric names the alert rules and the dashboard reference.

Rendering needs kubectl (with its built-in kustomize) and the rule checks need promtool (Debian's
`prometheus` package; .ci/run installs it): each test that needs one is skipped, saying which and
how to install it, where it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT

K8S = ROOT / "k8s"
OVERLAYS = ("partitioned-postgres", "partitioned-redis", "skip-locked", "static")
MONITORING = K8S / "monitoring"
RULES = MONITORING / "rules.yml"
RULES_TEST = MONITORING / "rules_test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
APP_IMAGE = "your-registry/your-app"  # the placeholder image name the overlays' `images:` replace
# the web component's, which an overlay's `images:` sets
WEB_IMAGE = "your-registry/bucket-dispatcher-web"
RENDER_TIMEOUT_S = 60  # one render takes ~0.3 s; a loaded 2-core machine may take ten times that

# The metric names of issue 10's contract: per pod, table-wide
# (one pod at a time), janitor. Histograms are referenced as NAME_bucket.
CONTRACT_HISTOGRAMS = frozenset(
    {
        "dispatcher_poll_cycle_seconds",
        "dispatcher_claim_seconds",
        "dispatcher_job_duration_seconds",
        "dispatcher_job_queue_wait_seconds",  # issue 28: run_at to claim, per queue
    }
)
CONTRACT_METRICS = CONTRACT_HISTOGRAMS | frozenset(
    {
        "dispatcher_jobs_claimed_total",
        "dispatcher_jobs_running",
        "dispatcher_jobs_in_flight",
        "dispatcher_job_outcomes_total",
        "dispatcher_job_timeouts_total",
        "dispatcher_jobs_reaped_total",
        "dispatcher_fenced_writes_total",
        "dispatcher_statement_timeouts_total",
        "dispatcher_store_errors_total",
        "dispatcher_lost_lease_jobs_total",
        "dispatcher_db_stalled",
        "dispatcher_coordinator_owned_buckets",
        "dispatcher_coordinator_members",
        "dispatcher_coordinator_is_leader",
        "dispatcher_coordinator_degraded",
        "dispatcher_coordinator_heartbeat_age_seconds",
        "dispatcher_loop_heartbeat_age_seconds",
        "dispatcher_ready",
        "dispatcher_build_info",
        # flow control (issue 25), per pod
        "dispatcher_queue_paused",
        "dispatcher_flow_limited_claims_total",
        "dispatcher_stuck_jobs_found_total",
        # table-wide
        "dispatcher_queue_jobs",
        "dispatcher_queue_halted_keys",
        "dispatcher_queue_oldest_runnable_age_seconds",
        "dispatcher_db_dead_tuples",
        "dispatcher_db_live_tuples",
        "dispatcher_db_claim_index_tuples_read_total",
        "dispatcher_db_lock_waits",
        "dispatcher_db_active_sessions",
        "dispatcher_table_sampler",
        "dispatcher_table_sample_age_seconds",
        # janitor
        "dispatcher_jobs_pruned_total",
        "dispatcher_janitor_lag_seconds",
        # schedules (issue 26), from the pod holding each queue's schedules lease
        "dispatcher_schedule_last_success_timestamp_seconds",
        "dispatcher_schedule_period_seconds",
        "dispatcher_schedule_jobs_total",
    }
)

# A metric name in PromQL: not part of a longer name, nor of a recording rule's `a:b:c` name.
_METRIC = re.compile(r"(?<![\w:])dispatcher_[a-z0-9_]+(?![\w:])")
_HISTOGRAM_SERIES = re.compile(r"^(?P<base>.+)_(bucket|sum|count)$")


_INSTALL = {
    "kubectl": (
        "the kustomize render tests need it (https://kubernetes.io/docs/tasks/tools/; "
        "kubectl >= 1.27 has kustomize v5 built in)"
    ),
    "promtool": "the alert-rule checks need it (`apt-get install prometheus`, as .ci/run does)",
}


def tool(name: str) -> str:
    """The path of `name` (kubectl, promtool); skips the test, saying how to install it, where
    missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: {_INSTALL[name]}")
    return path


def kubectl() -> str:
    return tool("kubectl")


def promtool() -> str:
    return tool("promtool")


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, check=False
    )


def render(directory: Path) -> str:
    """`kubectl kustomize DIRECTORY` as text; fails the test with kustomize's message."""
    done = run([kubectl(), "kustomize", str(directory)])
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return done.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, (
        f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    """Every PromQL query of the dashboard: panel targets and template-variable queries."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


def referenced_series(exprs: list[str]) -> set[str]:
    """The dispatcher_* series names the expressions read (histograms as NAME_bucket)."""
    return {m.group(0) for e in exprs for m in _METRIC.finditer(e)}


def metric_of(series: str) -> str:
    """dispatcher_claim_seconds_bucket -> dispatcher_claim_seconds (a contract histogram); else
    itself."""
    m = _HISTOGRAM_SERIES.match(series)
    if m and m.group("base") in CONTRACT_HISTOGRAMS:
        return m.group("base")
    return series


def referenced_metrics() -> set[str]:
    """Every series name the rules and the dashboard read."""
    return referenced_series(rule_expressions() + dashboard_expressions())
