"""Cancel with real worker processes (`dispatcher run`, the recording app): a queued job never
runs; a running one is cancelled at its owner's next heartbeat (async: the handler is cancelled;
sync: recorded when it returns), ends 'cancelled' and is never retried; a job whose worker died
is ended 'cancelled' by another worker's reaper; a handler that finishes before the request is
seen ends 'completed' (cancel is best effort, as in River)."""

import signal

import psycopg
import pytest

from dispatcher import enqueue_sync
from dispatcher.admin import Filters, cancel_jobs
from tests.helpers import (
    fetchall,
    fetchval,
    read_executions,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
)

pytestmark = pytest.mark.slow

FAST = dict(poll_interval_s=0.2, flush_interval_s=0.02, reaper_interval_s=0.3)
LEASE_S = 3.0  # heartbeat every lease / 3 = 1 s, for jobs held longer than 1 s
HEARTBEAT_S = LEASE_S / 3
# A request is seen within two heartbeat intervals (+10% jitter): the first beat that includes a
# job comes one interval after its claim, then one each interval. Plus a statement (the heartbeat),
# a flush (20 ms), and 1 s of slack for a loaded machine.
BOUND_S = 2 * HEARTBEAT_S * 1.1 + 1.0


def enqueue(dsn, job_type, **options):
    payload = options.pop("payload", None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_sync(conn, job_type, payload, **options)


def status(dsn, job_id):
    return fetchval(dsn, "SELECT status FROM dispatcher_jobs WHERE id = %s", (job_id,))


def started(record_dir, job_id):
    return bool(read_executions(record_dir, include_unfinished=True).get(job_id))


def cancel_to_end_s(dsn, job_id):
    """From the cancel request to the write that ended the job, by the database's clock."""
    return fetchval(
        dsn,
        "SELECT extract(epoch FROM updated_at - cancel_requested_at) FROM dispatcher_jobs "
        "WHERE id = %s",
        (job_id,),
    )


def test_a_cancelled_queued_job_never_runs(dsn, tmp_path):
    due = enqueue(dsn, "record")
    scheduled = enqueue(dsn, "record", delay_s=0.5)
    result = cancel_jobs(dsn, Filters(ids=(due, scheduled)))
    assert sorted(result.changed) == sorted([due, scheduled])
    worker = start_worker(dsn, tmp_path, log_path=tmp_path / "w.out", **FAST)
    try:
        # Claims go in run_at order: once a job due after both has run, neither can be waiting.
        marker = enqueue(dsn, "record", delay_s=1.0)
        wait_until(lambda: status(dsn, marker) == "completed", 30, "the marker job ran")
    finally:
        assert stop_workers([worker]) == [0]
    assert not started(tmp_path, due) and not started(tmp_path, scheduled)
    assert (status(dsn, due), status(dsn, scheduled)) == ("cancelled", "cancelled")


def test_a_running_async_job_is_cancelled_at_the_next_heartbeat_and_not_retried(dsn, tmp_path):
    job_id = enqueue(dsn, "record_slow", payload={"s": 60})
    worker = start_worker(dsn, tmp_path, log_path=tmp_path / "w.out", lease_s=LEASE_S, **FAST)
    try:
        wait_until(lambda: started(tmp_path, job_id), 30, "the handler started")
        assert cancel_jobs(dsn, Filters(ids=(job_id,))).requested == [job_id]
        wait_until(lambda: status(dsn, job_id) == "cancelled", 30, "the job ended cancelled")
        took_s = cancel_to_end_s(dsn, job_id)
        assert took_s <= BOUND_S, (
            f"cancelled {took_s:.2f} s after the request (bound {BOUND_S:.1f} s)"
        )
        # Not retried: nothing claims it again, whatever else the worker runs meanwhile.
        marker = enqueue(dsn, "record")
        wait_until(lambda: status(dsn, marker) == "completed", 30, "a later job ran")
    finally:
        assert stop_workers([worker]) == [0]
    (run,) = read_executions(tmp_path, include_unfinished=True)[job_id]
    assert run.outcome == "cancelled", "the handler itself saw the cancellation"
    row = fetchall(
        dsn,
        "SELECT status, attempts, lock_token, last_error FROM dispatcher_jobs WHERE id = %s",
        (job_id,),
    )
    assert row[0][:3] == ("cancelled", 1, None) and row[0][3].startswith(
        "cancelled: an operator asked"
    )


def test_a_running_sync_job_is_recorded_cancelled_when_its_thread_returns(dsn, tmp_path):
    job_id = enqueue(dsn, "record_sync", payload={"s": 6.0})  # a thread: it cannot be interrupted
    log = tmp_path / "w.out"
    worker = start_worker(dsn, tmp_path, log_path=log, lease_s=LEASE_S, **FAST)
    try:
        wait_until(lambda: started(tmp_path, job_id), 30, "the handler started")
        cancel_jobs(dsn, Filters(ids=(job_id,)))
        wait_until(
            lambda: "at an operator's request" in log.read_text(),
            BOUND_S + 5,
            "the worker saw the request",
        )
        # Seen, but the thread runs on: the job keeps its lease (heartbeats) and its status.
        assert status(dsn, job_id) == "running" and not read_executions(tmp_path).get(job_id)
        wait_until(
            lambda: status(dsn, job_id) == "cancelled", 30, "recorded when the thread returned"
        )
    finally:
        assert stop_workers([worker]) == [0]
    (run,) = read_executions(tmp_path)[job_id]
    assert run.outcome == "ok", "the thread ran to its end"
    ended_at = fetchval(
        dsn, "SELECT extract(epoch FROM updated_at) FROM dispatcher_jobs WHERE id = %s", (job_id,)
    )
    assert ended_at >= run.end - 0.5  # written after it returned (same machine, so clocks agree)
    assert "a thread cannot be interrupted" in fetchval(
        dsn, "SELECT last_error FROM dispatcher_jobs WHERE id = %s", (job_id,)
    )


def test_a_job_whose_worker_died_is_ended_cancelled_by_the_reaper(dsn, tmp_path):
    job_id = enqueue(dsn, "record_slow", payload={"s": 60})
    victim = start_worker(dsn, tmp_path, log_path=tmp_path / "victim.out", lease_s=2, **FAST)
    wait_until(lambda: started(tmp_path, job_id), 30, "the handler started")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert cancel_jobs(dsn, Filters(ids=(job_id,))).requested == [job_id]  # nobody left to see it
    reaper = start_worker(dsn, tmp_path, log_path=tmp_path / "reaper.out", lease_s=2, **FAST)
    try:
        wait_until(lambda: status(dsn, job_id) == "cancelled", 30, "the reaper ended it")
    finally:
        assert stop_workers([reaper]) == [0]
    assert len(read_executions(tmp_path, include_unfinished=True)[job_id]) == 1, "never run again"
    error = fetchval(dsn, "SELECT last_error FROM dispatcher_jobs WHERE id = %s", (job_id,))
    assert error.startswith("cancelled: an operator asked, and the job's lease expired once"), error
    assert status_counts(dsn) == {"cancelled": 1}


def test_a_job_that_finishes_before_the_request_is_seen_ends_completed(dsn, tmp_path):
    """Best effort, as in River: with a 30 s lease the first heartbeat of a job comes 10 s after
    its claim, and this one is done after 3 s."""
    job_id = enqueue(dsn, "record_slow", payload={"s": 3.0})
    worker = start_worker(dsn, tmp_path, log_path=tmp_path / "w.out", lease_s=30, **FAST)
    try:
        wait_until(lambda: started(tmp_path, job_id), 30, "the handler started")
        assert cancel_jobs(dsn, Filters(ids=(job_id,))).requested == [job_id]
        wait_until(lambda: status(dsn, job_id) == "completed", 30, "the job completed")
    finally:
        assert stop_workers([worker]) == [0]
    assert fetchval(
        dsn, "SELECT cancel_requested_at IS NOT NULL FROM dispatcher_jobs WHERE id = %s", (job_id,)
    )
