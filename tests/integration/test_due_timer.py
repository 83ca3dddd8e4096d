"""Delayed jobs start at their run_at, not at the next poll: the due timer
(dispatcher/runtime/due_timer.py).

The poll interval is 5 s (jittered to 4-6 s) and every job is due 1.5-3.6 s after the worker last
polled or claimed, so only the due timer can start one within 0.5 s of its run_at. Lateness is
measured on the database clock (locked_at - run_at); 0.5 s is generous for a loaded 2-core
machine: the timer itself is late by a claim's round trip (a few ms).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
import pytest

from dispatcher import Config, Job, Registry, Worker, enqueue, enqueue_sync
from tests.helpers import Deadline, fetchall, run_async, wait_until_async

LATE_BOUND_S = 0.5


def _worker(dsn: str, mode: str, done: list[int]) -> Worker:
    registry = Registry()

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        done.append(job.id)

    return Worker(
        Config(dsn=dsn, mode=mode, poll_interval_s=5, flush_interval_s=0.01).replace(), registry
    )


@contextlib.asynccontextmanager
async def _idle_worker(dsn: str, mode: str, done: list[int]) -> AsyncIterator[Worker]:
    """A running worker whose start-up claims and wake-ups are served: from here only a NOTIFY,
    the due timer or the 4-6 s poll makes it claim."""
    worker = _worker(dsn, mode, done)
    task = asyncio.create_task(worker.run())
    try:
        await worker.listening.wait()
        await wait_until_async(
            lambda: worker.stats.claims >= 1 and worker.idle, 15, "an idle worker"
        )
        yield worker
    finally:
        worker.stop()
        await task


def _lateness_s(dsn: str) -> dict[int, float]:
    rows = fetchall(
        dsn, "SELECT id, extract(epoch FROM locked_at - run_at)::float8 FROM dispatcher_jobs"
    )
    return {job_id: late for job_id, late in rows}


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_delayed_job_enqueued_while_the_worker_idles_starts_at_its_run_at(dsn, mode):
    """The NOTIFY path: the enqueue's notification carries the delay; the owner arms its timer."""
    done: list[int] = []

    async def main():
        async with _idle_worker(dsn, mode, done):
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                job_id = await enqueue(conn, "ping", delay_s=1.5)
            await wait_until_async(
                lambda: done, Deadline(10), "the delayed ping handled", interval_s=0.01
            )
            return job_id

    job_id = run_async(main())
    late_s = _lateness_s(dsn)[job_id]
    print(f"{mode}: started {1000 * late_s:.1f} ms after run_at (NOTIFY path)")
    assert 0 <= late_s < LATE_BOUND_S, late_s


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_delayed_jobs_enqueued_before_the_worker_started_start_at_their_run_at(dsn, mode):
    """The query path: no NOTIFY reaches the worker; it asks the database for its next run_at.
    Two jobs in a chain (the second is found after the first one's wake-up), and the earlier one
    has the worse priority: the next run_at is the minimum over priorities, not over the first
    priority only (that one would make the first job 0.6 s late). 3 s of lead: start-up must end
    before the first is due, or its first claim would take it and prove nothing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        early = enqueue_sync(conn, "ping", delay_s=3.0, priority=5)
        later = enqueue_sync(conn, "ping", delay_s=3.6, priority=0)
    done: list[int] = []
    worker = _worker(dsn, mode, done)

    async def main():
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(
                lambda: worker.stats.claims >= 1, 10, "the first claim of start-up", interval_s=0.01
            )
            queued_after_start_up = fetchall(
                dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status = 'queued'"
            )[0][0]
            await wait_until_async(
                lambda: len(done) >= 2, Deadline(15), "both delayed pings handled", interval_s=0.01
            )
            return queued_after_start_up
        finally:
            worker.stop()
            await task

    queued_after_start_up = run_async(main())
    assert queued_after_start_up == 2, (
        "start-up took longer than the 3 s lead: the test proves nothing"
    )
    lateness = _lateness_s(dsn)
    print(
        f"{mode}: started {1000 * lateness[early]:.1f} and {1000 * lateness[later]:.1f} ms "
        "after run_at (query path)"
    )
    assert 0 <= lateness[early] < LATE_BOUND_S, lateness
    assert 0 <= lateness[later] < LATE_BOUND_S, lateness


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_delayed_jobs_due_a_few_ms_apart_each_start_at_their_run_at(dsn, mode):
    """Pairs of jobs due 3 ms apart, pairs 0.6 s apart. The second of a pair comes due while the
    wake-up of the first is claiming: it must be armed or claimed then. (When the next run_at was
    asked after the claim, a job that came due between the two statements was neither, and waited
    for the next pair's wake-up, 0.6 s on; and uvloop's timers, firing up to ~2 ms early, made the
    claim see a job not due yet.)"""
    pairs = 8
    done: list[int] = []

    async def main():
        async with _idle_worker(dsn, mode, done):
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                base = (await (await conn.execute("SELECT now()")).fetchone())[0]
                for i in range(pairs):
                    for offset_s in (0.0, 0.003):
                        await enqueue(
                            conn, "ping", run_at=base + timedelta(seconds=1.5 + 0.6 * i + offset_s)
                        )
            await wait_until_async(
                lambda: len(done) >= 2 * pairs,
                Deadline(20),
                "every delayed ping handled",
                interval_s=0.01,
            )

    run_async(main())
    lateness = sorted(_lateness_s(dsn).values())
    print(
        f"{mode}: lateness p50 {1000 * lateness[len(lateness) // 2]:.1f} ms, "
        f"max {1000 * lateness[-1]:.1f} ms"
    )
    assert len(lateness) == 2 * pairs and lateness[0] >= 0, lateness
    assert lateness[-1] < LATE_BOUND_S, lateness
