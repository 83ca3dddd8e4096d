"""k8s/monitoring: the alert rules pass `promtool check rules` and their unit tests (`promtool
test rules`), the PrometheusRule is rules.yml as it is, the dashboard is valid JSON with valid
PromQL, and every metric either of them reads is one of the contract's names. That a real worker
exports each of them is tests/integration/test_monitoring_metrics.py."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import yaml

from tests.deploy.support import (
    CONTRACT_METRICS,
    DASHBOARD,
    MONITORING,
    RULES,
    RULES_TEST,
    dashboard_expressions,
    metric_of,
    promtool,
    referenced_metrics,
    referenced_series,
    rule_expressions,
    run,
)


def test_rules_pass_promtool_check() -> None:
    done = run([promtool(), "check", "rules", str(RULES)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_rules_unit_tests_pass() -> None:
    """rules_test.yml: the SLA (oldest runnable job and queue wait), backlog, degraded-worker,
    failure, lock-wait, busy-database, sampler, poll-cycle and halted-keys alerts fire on their
    series and stay quiet short of them."""
    done = run([promtool(), "test", "rules", RULES_TEST.name], cwd=MONITORING)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
    }
    alerts = {
        r["alert"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert alerts <= tested, f"alerts without a unit test: {sorted(alerts - tested)}"


def test_rules_unit_tests_can_fail(tmp_path: Path) -> None:
    """The SLA threshold moved from 300 s to 3000 s: the SLA test must now fail."""
    (tmp_path / "rules.yml").write_text(
        RULES.read_text().replace(
            "(dispatcher_queue_oldest_runnable_age_seconds) > 300",
            "(dispatcher_queue_oldest_runnable_age_seconds) > 3000",
        )
    )
    (tmp_path / "rules_test.yml").write_text(RULES_TEST.read_text())
    done = run([promtool(), "test", "rules", "rules_test.yml"], cwd=tmp_path)
    assert (
        done.returncode != 0 and "DispatcherOldestRunnableJobOverSLA" in done.stdout + done.stderr
    )


def test_prometheusrule_is_generated_from_rules_yml() -> None:
    spec = importlib.util.spec_from_file_location(
        "prometheusrule", MONITORING / "prometheusrule.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (MONITORING / "prometheusrule.yaml").read_text() == module.render(RULES.read_text()), (
        "prometheusrule.yaml is stale: run `python k8s/monitoring/prometheusrule.py`"
    )


def test_dashboard_is_a_grafana_dashboard_with_a_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(
            t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]
        )
    titles = " | ".join(p["title"] for p in board["panels"])
    for wanted in (
        "by outcome",
        "p50 / p99 by job type",
        "Jobs by status",
        "Bucket ownership",
        "members, leader",
        "heartbeat age",
        "Dead and live tuples",
        "Claim-index reads per claimed job",
        "Oldest runnable",
        "Poll-cycle p99",
        "lock waits",
    ):
        assert wanted.lower() in titles.lower(), f"no panel for {wanted!r}"


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression (Grafana's variables
    replaced)."""
    variables = {"$namespace": ".*", "$job": ".*", "$__rate_interval": "1m"}
    rules = []
    for i, expr in enumerate(dashboard_expressions()):
        if expr.startswith("label_values("):  # Grafana's, not PromQL: check the selector inside
            expr = re.fullmatch(r"label_values\((.*), \w+\)", expr).group(1)  # type: ignore[union-attr]
        for name, value in variables.items():
            expr = expr.replace(name, value)
        rules.append({"record": f"dashboard:query:{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = run([promtool(), "check", "rules", str(path)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_referenced_metric_is_a_contract_name() -> None:
    rules, board = referenced_series(rule_expressions()), referenced_series(dashboard_expressions())
    assert len(rules) >= 10 and len(board) >= 20, (rules, board)
    unknown = {s for s in rules | board if metric_of(s) not in CONTRACT_METRICS}
    assert not unknown, f"not in the metric contract: {sorted(unknown)}"
    # Histograms are read through their buckets, never by the bare name.
    assert "dispatcher_poll_cycle_seconds_bucket" in referenced_metrics()
    assert "dispatcher_poll_cycle_seconds" not in referenced_metrics()


def _balanced(text: str, start: int) -> str:
    """The parenthesised group that opens at text[start] == '('."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    raise AssertionError(f"unbalanced: {text[start:]}")


def summed_arguments(expr: str) -> list[str]:
    """The argument of every sum/count in `expr` (after an optional `by (...)`/`without (...)`)."""
    out = []
    for m in re.finditer(r"\b(sum|count)\s*(?:(?:by|without)\s*\([^()]*\)\s*)?\(", expr):
        out.append(_balanced(expr, m.end() - 1))
    return out


def test_table_wide_series_are_never_summed() -> None:
    """Table-wide figures come from one pod at a time: a sum over pods would count a hand-off
    twice."""
    table_wide = (
        "dispatcher_queue_",
        "dispatcher_db_dead",
        "dispatcher_db_live",
        "dispatcher_db_claim_index",
        "dispatcher_db_lock_waits",
        "dispatcher_db_active_sessions",
        "dispatcher_table_sample_age",
    )
    assert summed_arguments("sum by (queue) (rate(dispatcher_queue_jobs[5m])) / max(x)") == [
        "(rate(dispatcher_queue_jobs[5m]))"
    ]  # the check sees what it is for
    for expr in rule_expressions() + dashboard_expressions():
        for argument in summed_arguments(expr):
            assert not any(t in argument for t in table_wide), f"summed table-wide series in {expr}"
