"""The charts' rollup on a real PostgreSQL: a worker's counts flushed, rolled up per minute and
read back exactly (completed rows kept or deleted), depth sampled, back-dated minutes on the 24h
chart and gone after 7 days, and a flush that fails losing no count."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from coordinator.pg.connect import ConnectionLimits
from dispatcher import Config, Job, Registry, Worker, enqueue_sync
from dispatcher.db.store import JobStore
from dispatcher.observe.job_metrics import JOB_STATS, WAIT_BUCKETS_S
from dispatcher.runtime.queue_stats import StatsFlusher, StatsRollup, totals
from dispatcher.web.chart_reads import read_series
from tests.helpers import fetchall, fetchval, wait_until_async

N_WAITS = len(WAIT_BUCKETS_S) + 1


def _series(dsn: str, span: str, queue: str | None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return read_series(conn, ConnectionLimits(), span, queue)


def _age_worker_rows(dsn: str, queue: str) -> None:
    """The workers' rows of `queue` a minute older: a closed minute, as after a minute's wait."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_stats_by_worker SET minute = minute - interval '1 minute'"
            " WHERE queue_name = %s",
            (queue,),
        )


@pytest.mark.parametrize("completed_jobs", ["keep", "delete"])
def test_a_workers_jobs_are_counted_once_per_minute_after_flush_and_rollup(dsn, completed_jobs):
    queue = f"charts-{uuid.uuid4().hex[:8]}"
    registry = Registry()

    @registry.handler("work")
    async def work(job: Job) -> None:
        if job.payload["fail"]:
            raise RuntimeError("no")

    n_ok, n_failed = 7, 3
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(n_ok + n_failed):
            enqueue_sync(conn, "work", {"fail": i < n_failed}, queue=queue, max_attempts=1)
    config = Config(
        dsn=dsn,
        queues=(queue,),
        poll_interval_s=0.1,
        flush_interval_s=0.01,
        completed_jobs=completed_jobs,
    )
    worker = Worker(config, registry)

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(
                lambda: (
                    (c := totals(JOB_STATS).get(queue)) is not None
                    and c.finished + c.failed == n_ok + n_failed
                ),
                20,
                "every job counted",
            )
            await worker.services.stats_flusher.flush()
        finally:
            worker.stop()
            await task

    asyncio.run(main())
    # Not rolled up yet: the chart reads the workers' rows (of a closed minute: the current one's
    # point is a rate over the seconds gone by).
    _age_worker_rows(dsn, queue)
    live = _series(dsn, "1h", queue)
    assert sum(live.finished_per_min) == n_ok and sum(live.failed_per_min) == n_failed
    assert any(p is not None for p in live.wait_p50_s) and live.any_data

    async def roll() -> None:
        store = JobStore(dsn, "roller")
        try:
            rollup = StatsRollup(store)
            await rollup.tick()
            assert rollup.holding and rollup.rounds == 1
        finally:
            await store.close()

    asyncio.run(roll())
    assert (
        fetchval(
            dsn, "SELECT count(*) FROM dispatcher_stats_by_worker WHERE queue_name = %s", (queue,)
        )
        == 0
    )
    rolled = fetchall(
        dsn,
        "SELECT finished, failed, cardinality(waits) FROM dispatcher_stats_by_minute"
        " WHERE queue_name = %s AND depth IS NULL",
        (queue,),
    )
    assert rolled == [(n_ok, n_failed, N_WAITS)]
    after = _series(dsn, "1h", queue)
    assert sum(after.finished_per_min) == n_ok and sum(after.failed_per_min) == n_failed
    assert after.depth[-1] == 0  # drained: sampled at 0, not a gap
    # all queues: at least ours (other tests of this process may have flushed into other queues)
    assert sum(_series(dsn, "24h", None).finished_per_min) * 10 >= n_ok


def test_depth_is_sampled_and_back_dated_minutes_show_on_the_day_and_age_out(dsn):
    queue = f"depth-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(4):
            enqueue_sync(conn, "work", None, queue=queue)
        # five hours ago, and eight days ago (older than the 7 days kept)
        conn.execute(
            "INSERT INTO dispatcher_stats_by_minute"
            " (minute, queue_name, finished, failed, waits, depth)"
            " VALUES (date_trunc('minute', now() - interval '5 hours'), %(q)s, 50, 5, %(w)s, 9),"
            "        (date_trunc('minute', now() - interval '8 days'), %(q)s, 70, 0, NULL, NULL)",
            {"q": queue, "w": [0] * 9 + [10] + [0] * (N_WAITS - 10)},
        )

    async def roll() -> None:
        store = JobStore(dsn, "roller")
        try:
            await StatsRollup(store).tick()
        finally:
            await store.close()

    asyncio.run(roll())
    day = _series(dsn, "24h", queue)
    assert sum(day.finished_per_min) * 10 == 50 and sum(day.failed_per_min) * 10 == 5
    assert max(d for d in day.depth if d is not None) == 9
    assert day.depth[-1] == 4  # sampled now: 4 due jobs
    (p50,) = [p for p in day.wait_p50_s if p is not None]
    assert WAIT_BUCKETS_S[8] < p50 <= WAIT_BUCKETS_S[9]
    assert not _series(dsn, "1h", queue).finished_per_min[-1]
    assert (
        fetchval(
            dsn,
            "SELECT count(*) FROM dispatcher_stats_by_minute"
            " WHERE queue_name = %s AND minute < now() - interval '7 days'",
            (queue,),
        )
        == 0
    )


def test_a_flush_that_fails_loses_no_count(dsn):
    queue = f"fail-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        limits = ConnectionLimits(statement_timeout_s=0.5)
        store = JobStore(dsn, "flusher", limits=limits)
        flusher = StatsFlusher(store, limits=limits)
        try:
            JOB_STATS.finished(queue, "t", "completed", 0.01)
            await flusher.flush()
            JOB_STATS.finished(queue, "t", "completed", 0.01)
            JOB_STATS.finished(queue, "t", "failed", 0.01)
            # the table locked past the flush's bound: the server cancels it, the counts stay
            with psycopg.connect(dsn) as locker:
                locker.execute("LOCK TABLE dispatcher_stats_by_worker IN EXCLUSIVE MODE")
                with pytest.raises(Exception):  # noqa: B017  (StoreUnavailable or a lock timeout)
                    await flusher.flush()
                locker.rollback()
            JOB_STATS.finished(queue, "t", "completed", 0.01)
            await flusher.flush()
        finally:
            await store.close()

    asyncio.run(main())
    assert fetchall(
        dsn,
        "SELECT sum(finished), sum(failed) FROM dispatcher_stats_by_worker WHERE queue_name = %s",
        (queue,),
    ) == [(3, 1)]


def test_a_worker_that_stops_has_flushed_every_count(dsn):
    """No explicit flush: the worker's own flusher, and its last flush at shutdown, write every
    outcome it counted."""
    queue = f"stop-{uuid.uuid4().hex[:8]}"
    registry = Registry()

    @registry.handler("work")
    async def work(job: Job) -> None:
        return None

    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(5):
            enqueue_sync(conn, "work", None, queue=queue)
    worker = Worker(Config(dsn=dsn, queues=(queue,), poll_interval_s=0.1), registry)

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(
                lambda: (c := totals(JOB_STATS).get(queue)) is not None and c.finished == 5,
                20,
                "the jobs counted",
            )
        finally:
            worker.stop()
            await task

    asyncio.run(main())
    assert fetchall(
        dsn,
        "SELECT sum(finished)::int FROM dispatcher_stats_by_worker WHERE queue_name = %s",
        (queue,),
    ) == [(5,)]
