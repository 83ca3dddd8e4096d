"""A rollout that adds a job type: old workers (without its handler) beside a new one (with it),
in both modes, while the type's jobs arrive. Every job completes, none failed, none spent an
attempt on a worker that could not run it, no ordering key halts or runs out of order; a schedule
the new release declares starts within seconds, whoever held the queue's schedules lease; and the
hand-back statement itself: queued again, discarded once nobody served the type, cancelled when
asked."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from dispatcher import Config, Job, Registry, Worker, enqueue_many_sync, enqueue_sync
from dispatcher.api.enqueue import JobSpec
from dispatcher.db.handbacks import HandBack, hand_back
from dispatcher.db.store import JobStore
from tests.helpers import fetchall, fetchval, run_async, wait_until_async

KEYS = 10


def handed_back_so_far(job_type: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "dispatcher_jobs_unserved_total",
            {"queue": "default", "job_type": job_type, "outcome": "handed_back"},
        )
        or 0.0
    )


def config(dsn: str, mode: str, worker_id: str) -> Config:
    return Config(
        dsn=dsn, mode=mode, worker_id=worker_id, poll_interval_s=0.2, flush_interval_s=0.02
    )


@pytest.mark.slow  # workers drain for seconds: not in the second server's pass (.ci/run)
@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_old_workers_hand_the_new_types_jobs_back_and_every_one_completes(dsn, mode):
    old, new = Registry(), Registry()
    for registry in (old, new):
        registry.handler("plain")(lambda job: None)
    runs: list[tuple[int, int, str | None]] = []  # (id, attempts, ordering key), in start order

    @new.handler("x")
    async def x(job: Job) -> None:
        runs.append((job.id, job.attempts, job.ordering_key))

    before = handed_back_so_far("x")

    async def rollout() -> None:
        olds = [Worker(config(dsn, mode, f"old-{i}"), old) for i in range(2)]
        newer = Worker(config(dsn, mode, "new-0"), new)
        tasks = [asyncio.create_task(w.run()) for w in [*olds, newer]]
        try:
            await asyncio.sleep(0)  # the workers start; the jobs arrive while they run
            for wave in range(5):
                specs = [JobSpec("x", {"n": n}) for n in range(60)]
                specs += [
                    JobSpec("x", {"wave": wave}, ordering_key=f"key-{k}") for k in range(KEYS)
                ]
                specs += [JobSpec("plain", {}) for _ in range(20)]
                with psycopg.connect(dsn, autocommit=True) as conn:
                    await asyncio.to_thread(enqueue_many_sync, conn, specs)
                await asyncio.sleep(0.3)
            await wait_until_async(
                lambda: handed_back_so_far("x") > before, 30, "an old worker handed an x job back"
            )
            for worker in olds:  # the rollout ends: the old pods stop
                worker.stop()
            x_jobs = fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE job_type = 'x'")
            await wait_until_async(
                lambda: len(runs) >= x_jobs, 60, f"all {x_jobs} x jobs ran on the new worker"
            )
        finally:
            for worker in [*olds, newer]:
                worker.stop()
            await asyncio.gather(*tasks)

    run_async(rollout())
    statuses = dict(fetchall(dsn, "SELECT status, count(*) FROM dispatcher_jobs GROUP BY status"))
    assert statuses == {"completed": fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs")}
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE ordering_halted") == 0
    assert len(runs) == len({job_id for job_id, _, _ in runs}), "each x job ran once"
    assert {attempts for _, attempts, _ in runs} == {1}, "no attempt spent by the old workers"
    for key in {k for _, _, k in runs if k is not None}:
        in_run_order = [job_id for job_id, _, k in runs if k == key]
        assert in_run_order == sorted(in_run_order), f"{key} ran in enqueue order"


@pytest.mark.slow
def test_a_schedule_of_the_new_release_starts_within_seconds_while_an_old_worker_held_the_lease(
    dsn,
):
    old, new = Registry(), Registry()
    old.handler("plain")(lambda job: None)
    started: list[float] = []

    @new.handler("tick")
    async def tick(job: Job) -> None:
        started.append(time.monotonic())

    new.schedule("every-second", every_s=1, job_type="tick")

    async def rollout() -> float:
        older = Worker(config(dsn, "partitioned", "old-0"), old)
        tasks = [asyncio.create_task(older.run())]
        newer = Worker(config(dsn, "partitioned", "new-0"), new)
        try:
            await wait_until_async(
                lambda: (
                    fetchval(
                        dsn,
                        "SELECT holder FROM dispatcher_maintenance_leases "
                        "WHERE name = 'schedules:default' AND expires_at > now()",
                    )
                    == "old-0"
                ),
                30,
                "the old worker holds the queue's schedules lease",
            )
            began = time.monotonic()
            tasks.append(asyncio.create_task(newer.run()))
            await wait_until_async(lambda: started, 30, "the new schedule's first job started")
            return started[0] - began
        finally:
            for worker in (older, newer):
                worker.stop()
            await asyncio.gather(*tasks)

    took_s = run_async(rollout())
    assert took_s < 10, f"the new release's schedule started {took_s:.1f} s after its pod"


# -- the statement -----------------------------------------------------------------------------


def test_a_hand_back_requeues_keeps_the_key_and_discards_only_long_unserved_old_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        young, old = enqueue_sync(conn, "y", {}), enqueue_sync(conn, "y", {})
        keyed = enqueue_sync(conn, "y", {}, ordering_key="k")
        cancelled = enqueue_sync(conn, "y", {})
        behind = enqueue_sync(conn, "y", {}, ordering_key="k")
        conn.execute(
            "UPDATE dispatcher_jobs SET created_at = now() - interval '2 hours' WHERE id = %s",
            (old,),
        )

    async def go() -> Any:
        store = JobStore(dsn, "old-pod")
        try:
            jobs = (await store.jobs_claim("default", 10, 30.0, None)).jobs
            assert sorted(j.id for j in jobs) == sorted([young, old, keyed, cancelled])
            await store.jobs_cancel([cancelled])  # asked while it was claimed
            written = await hand_back(
                store, [HandBack(j, 5.0, True, "nobody serves y") for j in jobs], 3600.0
            )
            again = await hand_back(store, [HandBack(jobs[0], 5.0, True, "")], 3600.0)
            return {h.id: h.status for h in written}, again
        finally:
            await store.close()

    written, again = run_async(go())
    assert written == {
        young: "queued",
        old: "discarded",
        keyed: "queued",
        cancelled: "cancelled",
    }
    assert again == [], "a second hand-back by a stale token is fenced"
    rows = {
        r[0]: r[1:]
        for r in fetchall(
            dsn,
            "SELECT id, status, attempts, run_at > now() + interval '3 seconds', last_error, "
            "ordering_halted FROM dispatcher_jobs WHERE id = ANY(%s)",
            ([young, old, keyed, behind],),
        )
    }
    assert rows[young] == ("queued", 0, True, None, False), "due again later, attempt given back"
    assert rows[keyed] == ("queued", 0, True, None, False), "still its key's holder, not halted"
    assert rows[behind][0] == "waiting", "the key's next job still waits behind it"
    assert rows[old][:2] == ("discarded", 0) and rows[old][3] == "nobody serves y"
