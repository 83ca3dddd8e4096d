"""Workflows, batches and results with real workers, in both modes: a fan-out and fan-in where no
job starts before every parent completed and none runs twice, a chain whose steps run in order, a
batch whose callback gets its members' counts, and `handle.result()` returning the value of a job
run by another worker (or raising its error), woken by NOTIFY."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import psycopg_pool
import pytest

from dispatcher import (
    Config,
    Job,
    JobFailed,
    JobSpec,
    PermanentJobError,
    Registry,
    Worker,
    Workflow,
    enqueue,
    enqueue_batch,
    enqueue_workflow,
)
from tests.helpers import fetchval, run_async, wait_until_async

# Workers that drain for seconds: left out of the second server's pass (.ci/run), as are the
# multi-process tests.
pytestmark = pytest.mark.slow


def config(dsn: str, mode: str, worker_id: str) -> Config:
    return Config(
        dsn=dsn, mode=mode, worker_id=worker_id, poll_interval_s=0.2, flush_interval_s=0.02
    )


class Recorder:
    """When each job started and finished (monotonic), and how many times it started."""

    def __init__(self) -> None:
        self.started: dict[int, list[float]] = {}
        self.finished: dict[int, float] = {}

    def registry(self) -> Registry:
        registry = Registry()

        @registry.handler("step")
        async def step(job: Job) -> dict[str, Any]:
            self.started.setdefault(job.id, []).append(time.monotonic())
            await asyncio.sleep(0.002)
            self.finished[job.id] = time.monotonic()
            return {"n": job.payload.get("n")}

        @registry.handler("boom")
        async def boom(job: Job) -> None:
            self.started.setdefault(job.id, []).append(time.monotonic())
            raise PermanentJobError("the report failed")

        return registry


async def run_fleet(dsn: str, mode: str, recorder: Recorder, work: Any, n: int = 2) -> Any:
    workers = [Worker(config(dsn, mode, f"w{i}"), recorder.registry()) for i in range(n)]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        return await work()
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_fan_out_and_fan_in_runs_each_job_once_after_all_its_parents(dsn, mode):
    recorder = Recorder()
    wf = Workflow()
    wf.add("root", "step", {"n": -1})
    children = [wf.add(f"c{n}", "step", {"n": n}, after=["root"]) for n in range(200)]
    wf.add("sink", "step", {"n": 999}, after=children)

    async def work() -> dict[str, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            ids = await enqueue_workflow(conn, wf)
        await wait_until_async(
            lambda: ids["sink"] in recorder.finished, 60, "the sink ran after the fan-out"
        )
        return ids

    ids = run_async(run_fleet(dsn, mode, recorder, work))
    assert all(len(starts) == 1 for starts in recorder.started.values()), "no job ran twice"
    root = ids["root"]
    for name in children:
        assert recorder.started[ids[name]][0] >= recorder.finished[root], f"{name} after root"
    last_child = max(recorder.finished[ids[name]] for name in children)
    assert recorder.started[ids["sink"]][0] >= last_child, "the sink after every child"
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_job_deps") == 0, "no edge left"


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_chain_runs_in_order_and_a_batch_callback_gets_the_counts(dsn, mode):
    recorder = Recorder()
    wf = Workflow()
    previous: list[str] = []
    for n in range(20):
        previous = [wf.add(f"s{n}", "step", {"n": n}, after=previous)]

    async def work() -> tuple[dict[str, int], Any]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            ids = await enqueue_workflow(conn, wf)
            batch = await enqueue_batch(
                conn,
                [JobSpec("step", {"n": n}) for n in range(10)] + [JobSpec("boom")],
                JobSpec("step", {"n": "callback"}),
            )
            counts = await batch.batch_id.result(timeout=60)
            assert counts == {"n": "callback"}  # the callback's own return value
            payload = fetchval(
                dsn, "SELECT payload FROM dispatcher_jobs WHERE id = %s", (batch.batch_id,)
            )
            await wait_until_async(lambda: ids["s19"] in recorder.finished, 60, "the chain ended")
        return ids, payload

    ids, payload = run_async(run_fleet(dsn, mode, recorder, work))
    order = [recorder.started[ids[f"s{n}"]][0] for n in range(20)]
    assert order == sorted(order)
    for n in range(1, 20):
        assert recorder.started[ids[f"s{n}"]][0] >= recorder.finished[ids[f"s{n - 1}"]]
    assert payload["batch"]["counts"] == {
        "completed": 10,
        "failed": 0,
        "discarded": 1,
        "cancelled": 0,
    }


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_result_is_awaited_across_workers_and_a_failure_raises(dsn, mode):
    recorder = Recorder()

    async def work() -> None:
        pool = psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
        await pool.open()
        try:
            ok = await enqueue(pool, "step", {"n": 7})
            bad = await enqueue(pool, "boom")
            assert ok is not None and bad is not None
            assert await ok.result(timeout=30) == {"n": 7}
            with pytest.raises(JobFailed) as failed:
                await bad.result(timeout=30)
            assert failed.value.status == "discarded"
            assert "the report failed" in (failed.value.error or "")
            # a second wait on a finished job answers at once
            assert await ok.result(timeout=1) == {"n": 7}
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert await asyncio.to_thread(ok.result_sync, 5, using=conn) == {"n": 7}
        finally:
            await pool.close()

    run_async(run_fleet(dsn, mode, recorder, work))
