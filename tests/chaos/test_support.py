"""The tier's own machinery: a WorkerProcess's log waits, pause and exit, and the faulty app's
handlers recording every execution's start and end as documented (tests/apps/recording.py)."""

from __future__ import annotations

import psycopg
import pytest

from dispatcher import enqueue_payloads_sync
from tests.chaos.support import _state
from tests.helpers import fetchall, wait_until

pytestmark = pytest.mark.chaos


def test_worker_process_and_faulty_handlers_record_start_and_end(chaos_dsn, workers):
    with psycopg.connect(chaos_dsn, autocommit=True) as conn:
        for job_type, payload in [
            ("swallow_cancel", {"s": 0.3}),
            ("never_returns_sync", {"s": 0.3}),
            ("raise_system_exit", {}),
            ("raise_keyboard_interrupt", {}),
        ]:
            enqueue_payloads_sync(conn, job_type, [payload], max_attempts=1)
    worker = workers.start(chaos_dsn, "w", job_timeout_s=0.1)  # swallow_cancel ignores the timeout
    match = worker.wait_for_log(r"worker (\w+) running", 30)
    assert match.group(1) == "w"
    # Claimed at least once (a claim counts the attempt) and no longer running: before the first
    # claim, the four queued rows would pass for finished.
    finished = (
        "SELECT job_type, status FROM dispatcher_jobs WHERE status <> 'running' AND attempts > 0 "
        "ORDER BY job_type"
    )
    rows = wait_until(
        lambda: r if len(r := fetchall(chaos_dsn, finished)) == 4 else None,
        30,
        lambda: f"4 jobs finished:\n{worker.log_tail()}",
    )
    statuses = dict(rows)
    # Each raised or overran (a sync thread cannot be interrupted: it fails when it returns). What
    # becomes of swallow_cancel's deaf overrun is the stall tests' business, not this one's.
    assert {
        t: statuses[t]
        for t in ("never_returns_sync", "raise_keyboard_interrupt", "raise_system_exit")
    } == dict.fromkeys(
        ("never_returns_sync", "raise_keyboard_interrupt", "raise_system_exit"), "failed"
    )

    outcomes = {}
    types = dict(fetchall(chaos_dsn, "SELECT id, job_type FROM dispatcher_jobs"))
    for job_id, runs in workers.executions().items():
        assert [(r.pid, r.end is not None) for r in runs] == [(worker.pid, True)]
        outcomes[types[job_id]] = runs[0].outcome
    assert outcomes == {
        "swallow_cancel": "ok",
        "never_returns_sync": "ok",
        "raise_system_exit": "SystemExit",
        "raise_keyboard_interrupt": "KeyboardInterrupt",
    }

    worker.pause()
    assert _state(worker.pid) == "T" and worker.alive()
    worker.resume()
    wait_until(lambda: _state(worker.pid) != "T", 5, "the worker to run again")
    assert worker.stop() == 0
    with pytest.raises(AssertionError, match="exited with 0"):
        worker.wait_for_log("never logged", 5)
