"""The worker's log lines survive an app that configures logging at import (as Django does with
its LOGGING), and a handler's own lines carry the job they belong to, in a real `dispatcher run`
process: tests/apps/logging_app.py calls dictConfig with disable_existing_loggers and its own
root handler; the worker logs JSON."""

from __future__ import annotations

import orjson
import psycopg

from dispatcher import enqueue_sync
from tests.helpers import start_worker, status_counts, stop_workers, wait_until


def test_the_apps_dictconfig_silences_nothing_and_handler_lines_carry_the_job(dsn, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = {
            "send_async": enqueue_sync(conn, "send_async", {"to": "a@example.com"}),
            "send_sync": enqueue_sync(conn, "send_sync", {"to": "b@example.com"}, queue="mail"),
            "explode": enqueue_sync(conn, "explode", {}, max_attempts=1),
        }
    out = tmp_path / "worker.out"
    worker = start_worker(
        dsn,
        app="tests.apps.logging_app:registry",
        log_path=out,
        log_format="json",
        queues="default,mail",
        worker_id="logging-app",
    )
    try:
        wait_until(
            lambda: status_counts(dsn) == {"completed": 2, "failed": 1}, 60, "the three jobs done"
        )
    finally:
        assert stop_workers([worker]) == [0]
    text = out.read_text()
    lines = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    app_lines = [line for line in text.splitlines() if line.startswith("APP ")]

    # The handler's own lines, async and sync, carry the job's fields (and the worker's id).
    sent = {line["job_type"]: line for line in lines if line["msg"].startswith("sent email to")}
    assert set(sent) == {"send_async", "send_sync"}, lines
    for job_type, line in sent.items():
        assert (line["job_id"], line["queue"], line["attempt"], line["worker"]) == (
            ids[job_type],
            "mail" if job_type == "send_sync" else "default",
            1,
            "logging-app",
        ), line
    # The dispatcher's own lines were not silenced: the final failure, the signal, the stop line
    # with its statistics as fields.
    assert any(
        line["level"] == "ERROR" and line.get("job_id") == ids["explode"] for line in lines
    ), lines
    assert any(line["msg"].startswith("received SIGTERM") for line in lines)
    (stopped,) = [line for line in lines if line["msg"].startswith("worker logging-app stopped in")]
    assert (stopped["completed"], stopped["failed"], stopped["claimed"]) == (2, 1, 3), stopped
    # And the worker said what the app's configuration had done.
    (warning,) = [line for line in lines if line["logger"] == "dispatcher.observe"]
    assert "disabled" in warning["msg"] and "put back" in warning["msg"], warning
    assert warning["app_log_handlers"] == ["StreamHandler"]
    # Lines outside a handler carry no job: the job fields come from the handler's context only.
    assert not any(
        "job_type" in line for line in lines if line["msg"].startswith("received SIGTERM")
    )
    assert app_lines, "the app's own handler still gets the lines it asked for"
