"""A real worker process logging JSON: every line parses and names the worker; each failed
attempt is a WARNING with the job's fields and the database's next run time, each final failure
an ERROR; a storm of failures is a bounded number of lines whose suppressed counts add up."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from dispatcher import enqueue_payloads_sync, enqueue_sync
from dispatcher.runtime.joblog import utc
from tests.helpers import (
    RETRY_LOG,
    fetchall,
    fetchval,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
)

pytestmark = pytest.mark.slow

APP = "tests.apps.failing:registry"
FAST: dict[str, Any] = dict(
    poll_interval_s=0.2,
    flush_interval_s=0.02,
    reaper_interval_s=0.3,
    retry_base_s=0.05,
    retry_cap_s=0.2,
)
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
JOB_FIELDS = (
    "job_id",
    "job_type",
    "queue",
    "bucket",
    "attempt",
    "max_attempts",
    "outcome",
    "reason",
    "error",
)


def json_lines(path: Path, worker: str) -> list[dict[str, Any]]:
    """Every line of the worker's output, parsed: each must be a JSON object naming the worker."""
    docs = []
    for line in path.read_text().splitlines():
        doc = orjson.loads(line)  # fails the test on any line that is not JSON
        assert doc["worker"] == worker and TS.fullmatch(doc["ts"]), line
        assert {"level", "logger", "msg"} <= doc.keys(), line
        docs.append(doc)
    return docs


def run_until(dsn: str, log_path: Path, done, what: str, **settings: Any) -> None:
    worker = start_worker(dsn, app=APP, log_path=log_path, **settings)
    try:
        wait_until(lambda: done() or worker.poll() is not None, 60, what)
        assert worker.poll() is None, log_path.read_text()[-3000:]
    finally:
        assert stop_workers([worker]) == [0], log_path.read_text()[-3000:]


def test_every_failed_attempt_and_final_failure_is_a_json_line_with_its_fields(dsn, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RETRY_LOG)  # the run_at of every retry, as the database wrote it
        ids = {
            t: enqueue_sync(conn, t, queue="mail", max_attempts=3)
            for t in ("fail", "fail_sync", "hang")
        }
        ids["permanent"] = enqueue_sync(conn, "permanent", queue="mail", max_attempts=3)
        # no handler for it
        ids["nobody"] = enqueue_sync(conn, "nobody", queue="mail", max_attempts=3)
        ids["chatty"] = enqueue_sync(
            conn, "chatty", {"dsn": "postgresql://app:Chatty-pw1@db/jobs"}, queue="mail"
        )
    log_path = tmp_path / "w.out"
    run_until(
        dsn,
        log_path,
        lambda: (
            status_counts(dsn) == {"failed": 3, "discarded": 1, "completed": 1, "queued": 1}
            and fetchval(
                dsn,
                "SELECT updated_at > created_at FROM dispatcher_jobs WHERE id = %s",
                (ids["nobody"],),
            )
        ),
        "every job to fail for good (or complete), and the one without a handler handed back",
        queues="mail",
        worker_id="logs-w1",
        log_format="json",
        **FAST,
    )

    docs = json_lines(log_path, "logs-w1")
    assert "Chatty-pw1" not in log_path.read_text()
    assert any(d["msg"].startswith("worker logs-w1 running") for d in docs)
    # the app's logger, from a thread too
    chatty = [d for d in docs if d["logger"] == "tests.apps.failing"]
    assert [d["msg"] for d in chatty] == [
        "connecting to postgresql://app:***@db/jobs",
        "from a thread: postgresql://app:***@db/jobs",
    ]
    jobs = [d for d in docs if d["logger"] == "dispatcher.jobs"]
    buckets = dict(fetchall(dsn, "SELECT id, bucket FROM dispatcher_jobs"))
    run_ats = {
        (job_id, attempt): utc(run_at)
        for job_id, attempt, run_at, _ in fetchall(dsn, "TABLE retry_log")
    }
    for doc in jobs:
        assert all(doc[f] is not None for f in JOB_FIELDS), doc
        assert (doc["queue"], doc["bucket"]) == ("mail", buckets[doc["job_id"]]), doc

    def lines_of(job_type: str) -> list[tuple[str, int, str, str]]:
        return [
            (d["level"], d["attempt"], d["reason"], d["outcome"])
            for d in jobs
            if d["job_id"] == ids[job_type]
        ]

    for job_type, reason in (("fail", "error"), ("fail_sync", "error"), ("hang", "timeout")):
        assert lines_of(job_type) == [
            ("WARNING", 1, reason, "queued"),
            ("WARNING", 2, reason, "queued"),
            ("ERROR", 3, reason, "failed"),
        ], job_type
    assert lines_of("permanent") == [("ERROR", 1, "permanent", "discarded")]
    assert lines_of("nobody") == [], "handed back, not failed: no outcome line"
    assert [d["level"] for d in docs if d.get("job_type") == "nobody"] == ["WARNING"], (
        "its type is named once"
    )

    retries = [d for d in jobs if d["level"] == "WARNING"]
    assert len(retries) == 6
    for doc in retries:  # the next run time is the row's run_at, to the millisecond
        assert doc["next_run_at"] == run_ats[(doc["job_id"], doc["attempt"])], doc
        assert 0 < doc["retry_in_s"] <= 0.2 and doc["max_attempts"] == 3, doc
    fail = [d for d in jobs if d["job_id"] == ids["fail"]]
    # the exception, in one line
    assert {d["error"] for d in fail} == {f"ValueError: boom {ids['fail']}"}
    assert re.fullmatch(
        rf"job {ids['fail']} failed \(attempt 1/3\); retrying in [0-9.e-]+ s", fail[0]["msg"]
    )
    assert fail[-1]["msg"] == f"job {ids['fail']} failed for good: its last attempt (3/3) failed"
    assert {d["error"] for d in jobs if d["job_id"] == ids["hang"]} == {"timed out after 0.3 s"}


def test_a_storm_of_failures_is_a_bounded_number_of_lines_that_add_up(dsn, tmp_path):
    jobs = 500
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "fail", [{}] * jobs, max_attempts=1)
    log_path = tmp_path / "w.out"
    run_until(
        dsn,
        log_path,
        lambda: status_counts(dsn).get("failed") == jobs,
        "every job to fail",
        worker_id="storm",
        log_format="json",
        **FAST,
    )

    docs = json_lines(log_path, "storm")
    finals = [d for d in docs if d["logger"] == "dispatcher.jobs" and d["level"] == "ERROR"]
    shown = [d for d in finals if "job_id" in d]
    suppressed = sum(d.get("suppressed", 0) for d in finals)
    assert shown and suppressed, finals
    assert len(shown) + suppressed == jobs  # every failure is a line or counted in one
    assert len(docs) < 60, len(docs)  # ~10 per 10 s window and key, plus start and stop lines
    summaries = [d for d in finals if "job_id" not in d]  # the counts of a key that went quiet
    assert all(
        re.fullmatch(
            r"\d+ similar lines suppressed in the last [0-9.]+ s; the last one: job \d+ failed "
            r"for good: its last attempt \(1/1\) failed",
            d["msg"],
        )
        for d in summaries
    ), summaries


def test_the_text_format_keeps_its_shape_with_the_worker_and_the_fields(dsn, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = enqueue_sync(conn, "fail", max_attempts=2)
    log_path = tmp_path / "w.out"
    run_until(
        dsn,
        log_path,
        lambda: status_counts(dsn) == {"failed": 1},
        "the job to fail for good",
        worker_id="text-w1",
        **FAST,
    )
    head = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
    lines = log_path.read_text().splitlines()
    assert lines and all(re.match(head + r".* worker=text-w1( |$)", line) for line in lines), lines
    [retry] = [line for line in lines if " WARNING dispatcher.jobs: " in line]
    bucket = fetchall(dsn, "SELECT bucket FROM dispatcher_jobs")[0][0]
    assert re.search(
        rf"job {job_id} failed \(attempt 1/2\); retrying in [0-9.e-]+ s "
        rf"worker=text-w1 job_id={job_id} "
        rf"job_type=fail queue=default bucket={bucket} attempt=1 max_attempts=2 outcome=queued "
        rf'reason=error error="ValueError: boom {job_id}" retry_in_s=[0-9.]+ next_run_at=\S+Z$',
        retry,
    )
    [final] = [line for line in lines if " ERROR dispatcher.jobs: " in line]
    assert f"job {job_id} failed for good: its last attempt (2/2) failed worker=text-w1" in final


def test_the_hard_exit_line_is_a_json_line_too(dsn, tmp_path):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_sync(conn, "slow")
    log_path = tmp_path / "w.out"
    worker = start_worker(
        dsn, app=APP, log_path=log_path, worker_id="hard-w1", log_format="json", **FAST
    )
    try:
        wait_until(lambda: status_counts(dsn) == {"running": 1}, 30, "the slow job to run")
        worker.send_signal(signal.SIGTERM)
        wait_until(
            lambda: "stopping gracefully" in log_path.read_text(), 30, "the graceful stop to begin"
        )
        # a second signal: exit at once, one line written with os.write
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 1
    finally:
        stop_workers([worker])
    last = json_lines(log_path, "hard-w1")[-1]
    assert last["level"] == "ERROR" and last["msg"].startswith(
        "received SIGTERM again during shutdown; exiting now"
    )
