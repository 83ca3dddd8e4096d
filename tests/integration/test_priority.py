"""Priority within a worker, end to end: 400 jobs of random priority (0-9) committed in one
transaction to idle workers that run one job at a time. Every job a worker starts from its own
buckets must be the best (smallest priority) still waiting there: no start passes a waiting job
of better priority (issue 38: a single partitioned worker passed one in 323 of its 400 starts,
because a backlog's claims read one window of its buckets at a time)."""

from __future__ import annotations

import asyncio
import random

import psycopg
import pytest

from dispatcher import Config, Job, JobSpec, Registry, Worker, enqueue_many_sync
from tests.helpers import Deadline, run_async, wait_until_async

JOBS = 400
Start = tuple[str, int, int]  # (worker, bucket, priority), in start order


def _enqueue_at_once(dsn: str, seed: int) -> None:
    rng = random.Random(seed)
    specs = [JobSpec("p", {"n": n}, priority=rng.randint(0, 9)) for n in range(JOBS)]
    with psycopg.connect(dsn) as conn, conn.transaction():
        enqueue_many_sync(conn, specs)


def _recording(name: str, starts: list[Start]) -> Registry:
    registry = Registry()

    @registry.handler("p")
    async def p(job: Job) -> None:
        starts.append((name, job.bucket, job.priority))

    return registry


def passed_over(starts: list[Start], worker: str, own: set[int] | None) -> list[int]:
    """The starts by `worker` of a job of its buckets (`own`; None: any) while a job of better
    priority waited in them: all jobs were there from the first claim, so every job that started
    later was waiting."""
    mine = own if own is not None else set(range(64))
    return [
        i
        for i, (name, bucket, priority) in enumerate(starts)
        if name == worker
        and bucket in mine
        and any(b in mine and p < priority for _, b, p in starts[i + 1 :])
    ]


def _config(dsn: str, **settings: object) -> Config:
    return Config(
        dsn=dsn, concurrency=1, poll_interval_s=5.0, flush_interval_s=0.01, **settings
    ).replace()


async def _drain(workers: list[Worker], starts: list[Start], ready, dsn: str) -> None:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await wait_until_async(
            lambda: all(w.listening.is_set() and w.idle for w in workers) and ready(),
            20,
            "the workers idle, listening, with their buckets",
        )
        await asyncio.to_thread(_enqueue_at_once, dsn, 38)
        await wait_until_async(
            lambda: len(starts) >= JOBS, Deadline(60), lambda: f"{len(starts)} of {JOBS} started"
        )
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)


@pytest.mark.slow  # workers drain for seconds: not in the second server's pass (.ci/run)
@pytest.mark.parametrize(
    "mode, steal",
    [("partitioned", False), ("partitioned", True), ("skip_locked", False)],
    ids=["partitioned-steal-off", "partitioned-steal-on", "skip_locked"],
)
def test_one_worker_starts_the_best_waiting_job_every_time(dsn, mode, steal):
    starts: list[Start] = []
    worker = Worker(_config(dsn, mode=mode, steal=steal), _recording("w", starts))

    def ready() -> bool:
        owned = worker.assignments["default"].owned()
        return mode == "skip_locked" or (owned is not None and len(owned) == 64)

    run_async(_drain([worker], starts, ready, dsn))
    assert len(starts) == JOBS
    assert len({p for _, _, p in starts}) == 10, "the test needs mixed priorities"
    assert passed_over(starts, "w", None) == []


@pytest.mark.slow
@pytest.mark.parametrize("steal", [False, True], ids=["steal-off", "steal-on"])
def test_two_workers_each_start_the_best_job_waiting_in_their_buckets(dsn, steal):
    """Workers of 32 buckets each: a backlog's claims read windows of 2 buckets, and a window's
    claim is vetoed while another of the worker's buckets holds a better job. Across the two
    workers nothing is promised (one may start a 9 while the other still has 0s waiting)."""
    starts: list[Start] = []
    halves = {"a": set(range(32)), "b": set(range(32, 64))}
    workers = [
        Worker(
            _config(dsn, coordinator="static", buckets=tuple(sorted(buckets)), steal=steal),
            _recording(name, starts),
        )
        for name, buckets in halves.items()
    ]
    run_async(_drain(workers, starts, lambda: True, dsn))
    assert len(starts) == JOBS
    for name, own in halves.items():
        assert passed_over(starts, name, own) == [], name
    assert sum(w.producer.stats.outranked for w in workers) >= 1, "no window was ever vetoed"
