"""The worker runtime in-process against a real PostgreSQL: outcomes, retries, timeouts, leases."""

import asyncio
import statistics
import uuid

import psycopg
import pytest

from dispatcher import (
    Cancel,
    Config,
    Job,
    PermanentJobError,
    Registry,
    Worker,
    enqueue_payloads_sync,
)
from dispatcher.backoff import retry_bound_s
from tests.helpers import RETRY_LOG, fetchall, fetchval, run_async, run_worker_until, status_counts


def config(dsn, **overrides):
    base = dict(dsn=dsn, poll_interval_s=0.1, flush_interval_s=0.01, reaper_interval_s=0.2)
    return Config(**{**base, **overrides}).replace()


def enqueue(dsn, job_type, n, **options):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_payloads_sync(conn, job_type, [{"n": i} for i in range(n)], **options)


def finished(dsn, expected):
    def check():
        counts = status_counts(dsn)
        return sum(counts.get(s, 0) for s in ("completed", "failed", "discarded")) >= expected

    return check


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_worker_drains_every_job_once(dsn, mode):
    registry = Registry()
    seen: list[int] = []

    @registry.handler("a")
    async def a(job: Job) -> None:
        seen.append(job.id)
        if job.payload["n"] % 3 == 0:
            await asyncio.sleep(0.001)  # some suspend, some finish without awaiting

    enqueue(dsn, "a", 3000)
    worker = Worker(config(dsn, mode=mode, concurrency=50, batch_size=100), registry)
    run_async(run_worker_until(worker, finished(dsn, 3000), 60, "3000 jobs finished"))
    assert len(seen) == len(set(seen)) == 3000
    assert status_counts(dsn) == {"completed": 3000}
    assert (
        fetchval(
            dsn,
            "SELECT count(*) FROM dispatcher_jobs WHERE attempts <> 1 OR lock_token IS NOT NULL",
        )
        == 0
    )


def test_a_partitioned_worker_claims_before_its_coordinator_has_joined(dsn):
    """The join is off the path to the first claim: until its coordinator adopts a view, the
    worker claims with SKIP LOCKED. Here the join cannot succeed (the owners table is renamed
    away), stealing is off and the coordinator lease is a minute, so the jobs can only finish in
    time through the joining worker's own SKIP LOCKED claims."""
    registry = Registry()

    @registry.handler("a")
    async def a(job: Job) -> None:
        return None

    enqueue(dsn, "a", 500)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE dispatcher_bucket_owners RENAME TO dispatcher_bucket_owners_away")
        try:
            worker = Worker(
                config(
                    dsn,
                    mode="partitioned",
                    coordinator="postgres",
                    coordinator_lease_s=60,
                    steal=False,
                ),
                registry,
            )
            run_async(
                run_worker_until(worker, finished(dsn, 500), 30, "500 jobs finished while joining")
            )
            # never joined: all claimed while joining
            assert [a.view for a in worker.assignments.values()] == [None]
        finally:
            conn.execute(
                "ALTER TABLE dispatcher_bucket_owners_away RENAME TO dispatcher_bucket_owners"
            )
    assert status_counts(dsn) == {"completed": 500}
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE attempts <> 1") == 0


def test_retries_land_in_the_future_with_growing_delay_then_fail(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RETRY_LOG)
    registry = Registry()

    @registry.handler("boom")
    async def boom(job: Job) -> None:
        raise ValueError(f"boom on attempt {job.attempts}")

    base_s, jobs, max_attempts = 0.05, 40, 4
    enqueue(dsn, "boom", jobs, max_attempts=max_attempts)
    worker = Worker(config(dsn, retry_base_s=base_s, retry_cap_s=10), registry)
    run_async(run_worker_until(worker, finished(dsn, jobs), 60, "every job failed for good"))

    retries = fetchall(
        dsn, "SELECT attempts, extract(epoch FROM run_at - written_at)::float8 FROM retry_log"
    )
    assert len(retries) == jobs * (max_attempts - 1)  # attempts 1..3 retried, attempt 4 is final
    assert all(delay > 0 for _, delay in retries), "a retry was not scheduled in the future"
    for attempt, delay in retries:
        assert delay <= retry_bound_s(attempt, base_s, 10) + 0.01
    means = [statistics.mean(d for a, d in retries if a == k) for k in range(1, max_attempts)]
    assert means == sorted(means) and means[-1] > 2 * means[0], means  # the delay grows
    rows = fetchall(
        dsn, "SELECT status, attempts, last_error, failed_at IS NOT NULL FROM dispatcher_jobs"
    )
    assert {(s, a, f) for s, a, _, f in rows} == {("failed", max_attempts, True)}
    assert all("ValueError: boom on attempt 4" in err for _, _, err, _ in rows)
    assert all(len(err) <= 2000 for _, _, err, _ in rows)


def test_a_job_of_a_type_without_a_handler_is_handed_back_never_failed(dsn):
    """A rollout's old pod: the job goes back due later, its attempt not spent (the rollout tests:
    tests/integration/test_rollout.py)."""
    enqueue(dsn, "nobody_handles_this", 5)
    registry = Registry()
    registry.handler("something_else")(lambda job: None)
    worker = Worker(config(dsn), registry)
    handed_back = (
        "SELECT count(*) = 5 FROM dispatcher_jobs WHERE status = 'queued' AND run_at > now() "
        "AND updated_at > created_at"
    )
    run_async(run_worker_until(worker, lambda: fetchval(dsn, handed_back), 30, "handed back"))
    rows = fetchall(dsn, "SELECT status, attempts, last_error, errors FROM dispatcher_jobs")
    assert set(rows) == {("queued", 0, None, None)}


def test_permanent_error_discards_without_retry(dsn):
    registry = Registry()

    @registry.handler("bad_input")
    async def bad_input(job: Job) -> None:
        raise PermanentJobError("customer does not exist")

    enqueue(dsn, "bad_input", 3)
    worker = Worker(config(dsn), registry)
    run_async(run_worker_until(worker, finished(dsn, 3), 30, "jobs discarded"))
    rows = fetchall(dsn, "SELECT status, attempts, last_error FROM dispatcher_jobs")
    assert {(s, a) for s, a, _ in rows} == {("discarded", 1)}
    assert all("customer does not exist" in e for _, _, e in rows)


def test_a_handler_that_raises_cancel_ends_its_keyed_job_cancelled_and_the_key_goes_on(dsn):
    registry = Registry()
    ran: list[int] = []

    @registry.handler("ship", max_attempts=5)
    async def ship(job: Job) -> None:
        ran.append(job.payload["n"])
        if job.payload["n"] == 0:
            raise Cancel("the order was refunded")

    enqueue(dsn, "ship", 3, ordering_keys=["order-7"] * 3)
    worker = Worker(config(dsn), registry)
    done = "SELECT count(*) = 3 FROM dispatcher_jobs WHERE status IN ('cancelled', 'completed')"
    run_async(run_worker_until(worker, lambda: fetchval(dsn, done), 30, "the key's jobs ended"))
    assert ran == [0, 1, 2], "the cancelled job never ran again; the key's next jobs ran in order"
    rows = fetchall(
        dsn, "SELECT payload->>'n', status, attempts, last_error FROM dispatcher_jobs ORDER BY id"
    )
    assert rows == [
        ("0", "cancelled", 1, "cancelled by its handler: the order was refunded"),
        ("1", "completed", 1, None),
        ("2", "completed", 1, None),
    ]


def test_per_job_timeout_cancels_the_handler_and_counts_as_a_failure(dsn):
    registry = Registry()
    cancelled = []

    @registry.handler("hang", timeout_s=0.2)
    async def hang(job: Job) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(job.id)
            raise

    enqueue(dsn, "hang", 2, max_attempts=1)
    worker = Worker(config(dsn), registry)
    run_async(run_worker_until(worker, finished(dsn, 2), 30, "hung jobs timed out"))
    rows = fetchall(dsn, "SELECT status, last_error FROM dispatcher_jobs")
    assert {s for s, _ in rows} == {"failed"}
    assert all("timed out after 0.2 s" in e for _, e in rows)
    assert len(cancelled) == 2


def test_heartbeats_keep_a_long_job_leased(dsn):
    """Lease 1 s, job 2.5 s: only heartbeats stop the reaper from taking it back."""
    registry = Registry()
    runs = []

    @registry.handler("long")
    async def long(job: Job) -> None:
        runs.append(job.id)
        await asyncio.sleep(2.5)

    enqueue(dsn, "long", 3)
    worker = Worker(
        config(dsn, lease_s=1, heartbeat_interval_s=0.25, reaper_interval_s=0.1), registry
    )
    run_async(run_worker_until(worker, finished(dsn, 3), 30, "long jobs completed"))
    assert status_counts(dsn) == {"completed": 3}
    assert len(runs) == 3 and worker.stats.reaped == 0 and worker.stats.leases_lost == 0
    assert fetchval(dsn, "SELECT max(attempts) FROM dispatcher_jobs") == 1


def test_sync_handlers_run_off_the_event_loop(dsn):
    import threading
    import time

    registry = Registry()
    threads = set()

    @registry.handler("blocking")
    def blocking(job: Job) -> None:
        threads.add(threading.current_thread().name)
        time.sleep(0.05)

    enqueue(dsn, "blocking", 20)
    worker = Worker(config(dsn, sync_threads=4), registry)
    run_async(run_worker_until(worker, finished(dsn, 20), 30, "sync jobs done"))
    assert status_counts(dsn) == {"completed": 20}
    assert threads and all(name.startswith("dispatcher-sync") for name in threads)


def test_history_records_one_row_per_attempt_when_enabled(dsn):
    registry = Registry()

    @registry.handler("flaky_once")
    async def flaky_once(job: Job) -> None:
        if job.attempts == 1:
            raise RuntimeError("first try fails")

    enqueue(dsn, "flaky_once", 10)
    worker = Worker(config(dsn, history=True, retry_base_s=0.01, retry_cap_s=0.02), registry)
    run_async(run_worker_until(worker, finished(dsn, 10), 30, "jobs completed on retry"))
    rows = fetchall(
        dsn,
        "SELECT attempt, outcome, count(*) FROM dispatcher_job_attempts GROUP BY 1, 2 ORDER BY 1",
    )
    assert rows == [(1, "retried", 10), (2, "completed", 10)]


def _hold(dsn, job_id, *, attempts, lease_s, max_attempts=3):
    """Mark a job running under a (possibly already expired) lease of a worker that is gone."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """UPDATE dispatcher_jobs SET status = 'running', attempts = %s, max_attempts = %s,
                               max_attempts_given = true,
                               locked_by = 'gone-pod', locked_at = now() - interval '10 s',
                               lock_token = %s,
                               lease_expires_at = now() + %s * interval '1 s'
                         WHERE id = %s""",
            (attempts, max_attempts, str(uuid.uuid4()), lease_s, job_id),
        )


def test_the_reaper_puts_expired_leases_through_the_retry_policy(dsn):
    from dispatcher.db.store import JobStore
    from dispatcher.runtime.maintenance import Reaper
    from dispatcher.runtime.retry import RetryPolicy
    from dispatcher.settings.sections import MaintenanceSettings

    enqueue(dsn, "t", 3)
    a, b, c = (r[0] for r in fetchall(dsn, "SELECT id FROM dispatcher_jobs ORDER BY id"))
    _hold(dsn, a, attempts=1, lease_s=-1)  # expired, attempts left: retried with backoff
    _hold(dsn, b, attempts=3, lease_s=-1)  # expired on its last attempt: failed for good
    _hold(dsn, c, attempts=1, lease_s=60)  # still leased: untouched
    woken = []

    async def main():
        store = JobStore(dsn, "reaper-test")
        try:
            settings = MaintenanceSettings(
                reaper_interval_s=1, history=True, table_sample_interval_s=15
            )
            reaper = Reaper(
                store, RetryPolicy(30.0, 60.0), settings, on_reaped=lambda: woken.append(1)
            )
            await reaper.tick()
            return reaper.reaped
        finally:
            await store.close()

    assert run_async(main()) == 2 and woken == [1]
    rows = {
        r[0]: r[1:]
        for r in fetchall(
            dsn,
            """
        SELECT id, status, attempts, lease_expiries, run_at > now(), failed_at IS NOT NULL,
               lock_token IS NULL, last_error
          FROM dispatcher_jobs""",
        )
    }
    assert rows[a][:6] == ("queued", 1, 1, True, False, True)
    assert rows[a][6].startswith(
        "lease expired once: its worker died or stalled (last held by gone-pod"
    )
    assert rows[b][:6] == ("failed", 3, 1, False, True, True)
    assert rows[c][:3] == ("running", 1, 0)
    history = fetchall(
        dsn,
        "SELECT job_id, attempt, worker, outcome, duration_ms > 9000 "
        "FROM dispatcher_job_attempts ORDER BY job_id",
    )
    assert history == [(a, 1, "gone-pod", "retried", True), (b, 3, "gone-pod", "failed", True)]


def test_a_reap_loses_to_a_heartbeat_or_a_new_claim_that_landed_first(dsn):
    """The reaper reads expired leases, then writes: if meanwhile the owner extended the lease
    (a stalled worker came back) or the job was taken over, the write is fenced off."""
    from dispatcher.db.rows import Failure
    from dispatcher.db.store import JobStore
    from dispatcher.model import FailureKind
    from dispatcher.runtime.retry import RetryPolicy

    enqueue(dsn, "t", 3)
    ids = [r[0] for r in fetchall(dsn, "SELECT id FROM dispatcher_jobs ORDER BY id")]
    for job_id in ids:
        _hold(dsn, job_id, attempts=1, lease_s=-1)
    extended, retaken, reaped = ids
    policy = RetryPolicy(1.0, 2.0)

    async def main():
        store = JobStore(dsn, "reaper-test")
        try:
            expired = await store.jobs_lease_expired()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "UPDATE dispatcher_jobs SET lease_expires_at = now() + interval '30 s' "
                    "WHERE id = %s",
                    (extended,),
                )
                conn.execute(
                    "UPDATE dispatcher_jobs SET lock_token = %s WHERE id = %s",
                    (str(uuid.uuid4()), retaken),
                )
            failures = [
                Failure(e.id, e.token, policy.decide(FailureKind.LEASE_EXPIRED, 1, 3, "x"))
                for e in expired
            ]
            return [w.id for w in await store.jobs_fail_owned(failures, lease_expired=True)]
        finally:
            await store.close()

    assert run_async(main()) == [reaped]
    assert dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs")) == {
        extended: "running",
        retaken: "running",
        reaped: "queued",
    }
