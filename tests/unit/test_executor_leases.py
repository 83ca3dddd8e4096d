"""The executor when a lease is lost or the grace period runs out: nothing whose lease is gone
starts or writes an outcome, and nothing runs twice at once (fake completer, real threads; leases
on a FakeClock that the tests advance, where they once slept)."""

import asyncio
import threading
import time

import pytest
from prometheus_client import REGISTRY

import dispatcher
from dispatcher.api.registry import Registry
from dispatcher.errors import StoreUnavailable
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.maintenance import LeaseKeeper
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.sections import LeaseSettings
from dispatcher.testing import FakeClock, MemoryStore
from tests.helpers import run_async, wait_until_async
from tests.unit.test_executor import Recorder, execution, job, leases


def leases_lost(reason: str) -> float:
    """dispatcher_leases_lost_total{reason} as a scrape reads it (process-wide: tests diff it)."""
    value = REGISTRY.get_sample_value("dispatcher_leases_lost_total", {"reason": reason})
    assert value is not None, "both series exist from the start"
    return value


def make(registry: Registry, clock=time.monotonic, **kw) -> tuple[Executor, Recorder]:
    recorder = Recorder()
    executor = Executor(
        registry,
        RetryPolicy(1.0, 60.0, rand=lambda: 0.5),
        recorder,
        execution(sync_threads=kw.pop("sync_threads", 1)),
        leases(**kw),
        clock=clock,
    )
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
        await wait_until_async(
            lambda: started == [4, 1] or started == [1, 4],
            5,
            "jobs 1 and 4 started",
            interval_s=0.005,
        )
        before = leases_lost("taken_over"), leases_lost("ran_out")
        assert executor.lose([1, 2, 4], "taken over") == 3
        assert executor.lose([1, 2, 4], "taken over") == 0  # already lost: counted once
        assert (leases_lost("taken_over"), leases_lost("ran_out")) == (before[0] + 3, before[1])
        # Job 1's thread still holds its slot, job 3 waits in the backlog; 2 and 4 freed theirs.
        await wait_until_async(
            lambda: executor.in_flight == 2, 5, "the lost jobs freed their slots", interval_s=0.005
        )
        release.set()
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005
        )

    run_async(main())
    executor.close()
    assert sorted(started) == [1, 3, 4], "job 2 was lost before it started: it must never start"
    assert rec.completed_ids == [3], (
        "job 1's thread finished after its lease was lost: no outcome of ours"
    )
    assert rec.outcomes == {}, "a cancelled lost job is not a failed attempt either"
    stats = executor.stats
    assert (stats.lost_dropped, stats.lost_cancelled, stats.lost_running) == (1, 1, 1)
    assert (stats.leases_taken_over, stats.leases_ran_out) == (3, 0)
    assert not executor.running_since(time.monotonic() + 100), "nothing of ours left to heartbeat"


def test_leases_about_to_run_out_without_a_heartbeat_are_lost_before_they_end():
    registry, started, release = blocking_registry()
    registry.handler("wait_async")(_sleep_30)
    clock = FakeClock()
    executor, rec = make(registry, lease_s=2.0, start_margin_s=0.1, lose_early_s=1.0, clock=clock)
    checks = []  # (clock, how many lost) of each firing of the executor's lease watch
    lose_expired = executor.lose_expired

    def recording_lose_expired(now):
        n = lose_expired(now)
        checks.append((clock(), n))
        return n

    executor.lose_expired = recording_lose_expired

    async def main():
        claimed_at = clock()
        executor.start([job(1, "block"), job(2, "block"), job(3, "wait_async")], claimed_at)
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        executor.extended([1, 2, 3], claimed_at - 1)  # an older extension never shortens a lease
        # No heartbeat reaches the database: the executor's own timer gives the jobs up 1 s
        # before their leases end (another worker may take them the moment they do). A heartbeat
        # round that extended nothing re-arms the timer from the clock's new time.
        clock.advance(0.9)
        executor.extended([], clock())
        await wait_until_async(lambda: checks, 5, "the watch fired at 0.9 s", interval_s=0.005)
        assert checks[0] == (0.9, 0), "1.1 s of lease left: kept"
        clock.advance(0.1)
        await wait_until_async(
            lambda: executor.stats.lost_running == 1,
            5,
            "the leases were given up",
            interval_s=0.005,
        )
        release.set()
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005
        )
        return claimed_at

    claimed_at = run_async(main())
    executor.close()
    lost = [(at, n) for at, n in checks if n]
    assert lost == [(claimed_at + 1.0, 3)], (
        "all three at once, by one timer, 1 s before the lease's end (2 s)"
    )
    assert (
        executor.stats.lost_dropped,
        executor.stats.lost_cancelled,
        executor.stats.lost_running,
    ) == (1, 1, 1)
    assert started == [1] and rec.completed_ids == [] and rec.outcomes == {}
    assert (executor.stats.leases_taken_over, executor.stats.leases_ran_out) == (0, 3), (
        "lost to the executor's own timer: counted as run out"
    )


async def _sleep_30(job):
    await asyncio.sleep(30)


def test_a_backlogged_job_whose_lease_is_about_to_lapse_is_not_started():
    registry, started, release = blocking_registry()
    clock = FakeClock()
    executor, rec = make(registry, lease_s=1.0, start_margin_s=0.5, clock=clock)

    async def main():
        executor.start([job(1, "block"), job(2, "block")])
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        clock.advance(0.6)  # job 2 waited for a thread with no heartbeat: 0.4 s of lease left
        release.set()
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005
        )

    ran_out = leases_lost("ran_out")
    run_async(main())
    executor.close()
    assert started == [1] and rec.completed_ids == [1]
    assert executor.stats.lost_dropped == 1
    assert executor.stats.leases_ran_out == 1 and leases_lost("ran_out") == ran_out + 1


def test_an_extended_lease_keeps_a_backlogged_job_startable():
    registry, started, release = blocking_registry()
    clock = FakeClock()
    executor, rec = make(registry, lease_s=1.0, start_margin_s=0.5, clock=clock)

    async def main():
        executor.start([job(1, "block"), job(2, "block")])
        await wait_until_async(lambda: started == [1], 5, "job 1 started", interval_s=0.005)
        clock.advance(0.6)
        executor.extended([1, 2], clock() + 10.0)  # a heartbeat landed
        release.set()
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005
        )

    run_async(main())
    release.set()
    executor.close()
    assert started == [1, 2] and sorted(rec.completed_ids) == [1, 2]


def test_after_the_grace_a_running_thread_is_never_given_back_and_abandoned_if_it_outlives_wait():
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
    assert rec.outcomes == {} and rec.completed_ids == [], (
        "requeueing it would let another worker run it beside us"
    )
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


def test_the_lease_keeper_keeps_leases_on_the_fake_clock_and_brings_a_cancel_request():
    """Executor, lease keeper and an in-memory store share one FakeClock: 3 s pass on a 2 s
    lease without a sleep, the heartbeats keep it, and a cancel request rides a heartbeat."""
    clock = FakeClock()
    store = MemoryStore(clock, worker_id="w1")
    registry, started, _ = blocking_registry()
    executor, rec = make(registry, lease_s=2.0, clock=clock)
    lease_settings = LeaseSettings(
        lease_s=2.0, heartbeat_s=0.5, start_margin_s=0.25, lose_early_s=0.125
    )
    keeper = LeaseKeeper(store, executor, lease_settings, clock=clock)  # type: ignore[arg-type]
    dispatcher.enqueue_sync(store, "wait")
    dispatcher.enqueue_sync(store, "wait")

    async def main():
        first, second = store.claim("default", 2, 2.0).jobs
        executor.start([first, second], clock())
        await wait_until_async(lambda: len(started) == 2, 5, "both handlers run", interval_s=0.005)
        for _ in range(5):
            clock.advance(0.6)
            assert await keeper.tick() is None
            assert await store.jobs_lease_expired() == [], (
                "each heartbeat pushed the lease 2 s past the clock"
            )
        assert clock() == pytest.approx(3.0) and executor.stats.lost_cancelled == 0
        assert {j.id for j in executor.running_since(clock())} == {first.id, second.id}
        assert store.cancel([first.id]) == {first.id: "running"}
        clock.advance(0.6)
        await keeper.tick()
        await wait_until_async(
            lambda: first.id in rec.outcomes, 5, "the handler was cancelled", interval_s=0.005
        )
        assert rec.outcomes[first.id].status == "cancelled" and second.id not in rec.outcomes
        assert [j.id for j in executor.running_since(clock())] == [second.id]
        # The executor counts the lease from the keeper's last send, on the same clock: 2 s from
        # now.
        assert executor.lose_expired(clock() + 1.99) == 0
        assert executor.lose_expired(clock() + 2.0) == 1

    run_async(main())
    executor.close()
    assert not keeper.stalled
    assert (executor.stats.leases_taken_over, executor.stats.leases_ran_out) == (0, 1), (
        "only the lease_expired call above gave one up"
    )


class StalledStore(MemoryStore):
    """A store whose heartbeats get no answer: a stalled database, or a stopped process."""

    async def jobs_extend_leases(self, jobs, lease_s):
        raise StoreUnavailable("heartbeat: no answer within 1 s")

    async def ping(self):
        raise StoreUnavailable("ping: no answer within 1 s")


def test_leases_that_run_out_while_heartbeats_fail_are_counted_as_lost_by_the_timer():
    """The lease keeper's statements fail; the executor's own timer gives the jobs up before their
    leases end. Both are leases lost: dispatcher_leases_lost_total{reason="ran_out"}, and the
    executor's stats (the worker's stop line), not only the heartbeat-found ones."""
    clock = FakeClock()
    store = StalledStore(clock, worker_id="w1")
    registry, started, _ = blocking_registry()
    executor, rec = make(registry, lease_s=2.0, lose_early_s=0.125, clock=clock)
    lease_settings = LeaseSettings(
        lease_s=2.0, heartbeat_s=0.5, start_margin_s=0.25, lose_early_s=0.125
    )
    keeper = LeaseKeeper(store, executor, lease_settings, clock=clock)  # type: ignore[arg-type]
    dispatcher.enqueue_sync(store, "wait")
    dispatcher.enqueue_sync(store, "wait")
    before = leases_lost("taken_over"), leases_lost("ran_out")

    async def main():
        jobs = store.claim("default", 2, 2.0).jobs
        executor.start(jobs, clock())
        await wait_until_async(lambda: len(started) == 2, 5, "both handlers run", interval_s=0.005)
        clock.advance(0.6)
        await keeper.tick()  # fails: stalled from now on
        assert keeper.stalled
        clock.advance(1.3)  # 1.9 s: within lose_early_s of the 2 s lease
        executor.extended([], clock())  # re-arms the timer on the clock's new time
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "the timer gave both up", interval_s=0.005
        )

    run_async(main())
    executor.close()
    assert (executor.stats.leases_taken_over, executor.stats.leases_ran_out) == (0, 2)
    assert (leases_lost("taken_over"), leases_lost("ran_out")) == (before[0], before[1] + 2)
    assert executor.stats.lost_cancelled == 2 and rec.outcomes == {}
