"""The executor when a lease is lost or the grace period runs out: nothing whose lease is gone
starts or writes an outcome, and nothing runs twice at once (fake completer, real threads)."""

import asyncio
import threading
import time

from dispatcher.api.registry import Registry
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.retry import RetryPolicy
from tests.helpers import run_async, wait_until_async
from tests.unit.test_executor import Recorder, job


def make(registry: Registry, **kw) -> tuple[Executor, Recorder]:
    recorder = Recorder()
    executor = Executor(registry, RetryPolicy(1.0, 60.0, rand=lambda: 0.5), recorder, worker_id="w1",
                        job_timeout_s=0, sync_threads=kw.pop("sync_threads", 1), **kw)
    return executor, recorder


def blocking_registry() -> tuple[Registry, list[int], threading.Event]:
    registry = Registry()
    started: list[int] = []
    release = threading.Event()

    @registry.handler("block")
    def block(job):
        started.append(job.id)
        release.wait(10)

    @registry.handler("wait")
    async def wait(job):
        started.append(job.id)
        await asyncio.sleep(30)

    return registry, started, release


def test_a_lost_lease_drops_unstarted_jobs_cancels_async_ones_and_fences_running_threads():
    registry, started, release = blocking_registry()
    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "block"), job(2, "block"), job(3, "block"), job(4, "wait")])
        await wait_until_async(lambda: started == [4, 1] or started == [1, 4], 5, "jobs 1 and 4 started",
                               interval_s=0.005)
        assert executor.lose([1, 2, 4], "taken over") == 3
        assert executor.lose([1, 2, 4], "taken over") == 0  # already lost: counted once
        # Job 1's thread still holds its slot, job 3 waits in the backlog; 2 and 4 freed theirs.
        await wait_until_async(lambda: executor.in_flight == 2, 5, "the lost jobs freed their slots",
                               interval_s=0.005)
        release.set()
        await wait_until_async(lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005)

    run_async(main())
    executor.close()
    assert sorted(started) == [1, 3, 4], "job 2 was lost before it started: it must never start"
    assert rec.completed_ids == [3], "job 1's thread finished after its lease was lost: no outcome of ours"
    assert rec.outcomes == {}, "a cancelled lost job is not a failed attempt either"
    stats = executor.stats
    assert (stats.lost_dropped, stats.lost_cancelled, stats.lost_running) == (1, 1, 1)
    assert not executor.running_since(time.monotonic() + 100), "nothing of ours left to heartbeat"


def test_leases_about_to_run_out_without_a_heartbeat_are_lost_before_they_end():
    registry, started, release = blocking_registry()
    registry.handler("wait_async")(_sleep_30)
    executor, rec = make(registry, lease_s=2.0, start_margin_s=0.1, lose_early_s=1.0)
    lost_at = []
    lose = executor.lose

    def recording_lose(ids, why):
        n = lose(ids, why)
        if n:
            lost_at.append(time.monotonic())
        return n

    executor.lose = recording_lose

    async def main():
        claimed_at = time.monotonic()
        executor.start([job(1, "block"), job(2, "block"), job(3, "wait_async")], claimed_at)
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        executor.extended([1, 2, 3], claimed_at - 1)  # an older extension never shortens a lease
        # No heartbeat reaches the database: the executor's own timer gives the jobs up 1 s
        # before their leases end (another worker may take them the moment they do).
        await wait_until_async(lambda: executor.stats.lost_running == 1, 5, "the leases were given up")
        release.set()
        await wait_until_async(lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005)
        return claimed_at

    claimed_at = run_async(main())
    executor.close()
    assert len(lost_at) == 1, "all three at once, by one timer"
    assert 1.0 <= lost_at[0] - claimed_at < 2.0, "given up before the lease's end (2 s), not after it"
    assert (executor.stats.lost_dropped, executor.stats.lost_cancelled, executor.stats.lost_running) == (1, 1, 1)
    assert started == [1] and rec.completed_ids == [] and rec.outcomes == {}


async def _sleep_30(job):
    await asyncio.sleep(30)


def test_a_backlogged_job_whose_lease_is_about_to_lapse_is_not_started():
    registry, started, release = blocking_registry()
    executor, rec = make(registry, lease_s=1.0, start_margin_s=0.5)

    async def main():
        executor.start([job(1, "block"), job(2, "block")])
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        await asyncio.sleep(0.6)  # job 2 waited for a thread with no heartbeat: 0.4 s of lease left
        release.set()
        await wait_until_async(lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005)

    run_async(main())
    executor.close()
    assert started == [1] and rec.completed_ids == [1]
    assert executor.stats.lost_dropped == 1


def test_an_extended_lease_keeps_a_backlogged_job_startable():
    registry, started, release = blocking_registry()
    executor, rec = make(registry, lease_s=1.0, start_margin_s=0.5)

    async def main():
        executor.start([job(1, "block"), job(2, "block")])
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        await asyncio.sleep(0.6)
        executor.extended([1, 2], time.monotonic() + 10.0)  # a heartbeat landed
        release.set()
        await wait_until_async(lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005)

    run_async(main())
    release.set()
    executor.close()
    assert started == [1, 2] and sorted(rec.completed_ids) == [1, 2]


def test_after_the_grace_a_running_thread_is_never_given_back_and_is_abandoned_if_it_outlives_the_wait():
    registry, started, release = blocking_registry()
    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "block")])
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        await executor.drain(time.monotonic() + 0.05)
        left = await executor.interrupt(0.2)
        held = [j.id for j in executor.running_since(time.monotonic() + 100)]
        return left, held

    left, held = run_async(main())
    release.set()
    executor.close()
    assert left == 1
    assert rec.outcomes == {} and rec.completed_ids == [], "requeueing it would let another worker run it beside us"
    assert held == [], "abandoned: no more heartbeats, its lease lapses when the process ends"


def test_a_thread_that_returns_within_the_wait_gets_its_outcome():
    registry, started, release = blocking_registry()
    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "block")])
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        await executor.drain(time.monotonic() + 0.05)
        threading.Timer(0.1, release.set).start()
        return await executor.interrupt(5.0)

    assert run_async(main()) == 0
    executor.close()
    assert rec.completed_ids == [1]


def test_an_async_handler_that_swallows_cancellation_is_abandoned_after_a_bounded_wait():
    registry = Registry()
    cancels, started = [], []

    @registry.handler("stubborn")
    async def stubborn(job):
        started.append(job.id)
        while True:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancels.append(job.id)

    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "stubborn")])
        await wait_until_async(lambda: started == [1], 5, "the handler runs", interval_s=0.005)
        began = time.monotonic()
        left = await executor.interrupt(0.3)
        return left, time.monotonic() - began

    loop = asyncio.new_event_loop()
    try:
        left, waited = loop.run_until_complete(main())
    finally:
        loop.close()  # not asyncio.run: it would wait for the stubborn task forever
    assert left == 1 and cancels == [1]
    assert waited < 5, "the wait after cancelling is bounded"
    assert rec.outcomes == {} and rec.completed_ids == []
