"""Every metric the alert rules and the Grafana dashboard read (k8s/monitoring) is exported by a
real worker: a `dispatcher run` process with a metrics port runs completed, retried and failed jobs,
and its /metrics page must then carry each referenced series (histograms as NAME_bucket).

A labelled series appears only once a label value is set, so the jobs cover every outcome the
rules read. Fault-only series (statement timeouts, store errors, pruning) are deliberately not
referenced by the rules or the dashboard, so an idle healthy worker exports all of them.
"""

from __future__ import annotations

import gzip
import socket
import urllib.request

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher import enqueue_sync
from tests.deploy.support import referenced_metrics
from tests.helpers import start_worker, status_counts, stop_workers, wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exported(port: int) -> set[str] | None:
    """The sample names on the worker's /metrics page (None while it does not answer)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


@pytest.mark.slow
def test_every_metric_the_rules_and_dashboard_read_is_exported(dsn, tmp_path):
    wanted = referenced_metrics()
    assert len(wanted) >= 20, wanted
    port = _free_port()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(5):
            enqueue_sync(conn, "record")  # completed
        # One attempt retried, the second (the last) failed: both failure outcomes.
        enqueue_sync(conn, "raise_system_exit", max_attempts=2)
    worker = start_worker(
        dsn,
        tmp_path,
        app="tests.apps.monitored:registry",
        log_path=tmp_path / "w.out",
        metrics_port=port,
        poll_interval_s=0.2,
        retry_base_s=0.05,
        retry_cap_s=0.1,
        mode="partitioned",
        coordinator="postgres",
    )
    try:
        wait_until(
            lambda: status_counts(dsn) == {"completed": 5, "failed": 1},
            60,
            lambda: f"5 completed and 1 failed job, got {status_counts(dsn)}",
        )
        # The table-wide figures come with the sampler's next round: wait for every name, then
        # say which are missing.
        seen: set[str] = set()

        def all_exported() -> bool:
            nonlocal seen
            seen = _exported(port) or seen
            return wanted <= seen

        try:
            wait_until(all_exported, 60, "every referenced metric on /metrics")
        except AssertionError:
            pytest.fail(f"referenced by k8s/monitoring but not exported: {sorted(wanted - seen)}")
        _check_the_exposition(port)
    finally:
        assert stop_workers([worker]) == [0]


def _scrape(port: int, query: str = "", **headers: str) -> tuple[dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics{query}", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return {k.lower(): v for k, v in response.headers.items()}, response.read()


def _check_the_exposition(port: int) -> None:
    """What prometheus_client's own server would answer: labels by queue, the queue-wait
    histogram, no _created series, gzip, OpenMetrics, and `name[]` filtering."""
    headers, body = _scrape(port)
    assert (
        headers["content-type"].startswith("text/plain; version=0.0.4")
        and "content-encoding" not in headers
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert not [name for name, _ in samples if name.endswith("_created")]
    outcome = (("job_type", "record"), ("outcome", "completed"), ("queue", "default"))
    assert samples[("dispatcher_job_outcomes_total", outcome)] == 5
    # 5 claims of `record`, 2 of the job that failed twice: each claim's wait, once.
    assert samples[("dispatcher_job_queue_wait_seconds_count", (("queue", "default"),))] == 7
    assert samples[("dispatcher_job_queue_wait_seconds_sum", (("queue", "default"),))] >= 0

    headers, body = _scrape(port, **{"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body).startswith(b"# HELP")
    headers, body = _scrape(port, Accept="application/openmetrics-text; version=1.0.0")
    assert headers["content-type"].startswith("application/openmetrics-text") and body.endswith(
        b"# EOF\n"
    )
    _, body = _scrape(
        port, "?name[]=dispatcher_jobs_running&name[]=dispatcher_job_queue_wait_seconds_count"
    )
    names = {
        s.name for family in text_string_to_metric_families(body.decode()) for s in family.samples
    }
    assert names == {"dispatcher_jobs_running", "dispatcher_job_queue_wait_seconds_count"}, names
