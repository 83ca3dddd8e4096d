"""An operator's cancel, as the executor carries it out (fake completer, real tasks and threads):
every job it reaches ends 'cancelled', however its handler ends, and is never retried."""

import asyncio
import threading

from dispatcher.api.registry import Registry
from dispatcher.model import FailureKind
from tests.helpers import run_async, wait_until_async
from tests.unit.test_executor import job
from tests.unit.test_executor_leases import make


def registry_with_waits() -> tuple[Registry, list[str], threading.Event]:
    registry = Registry()
    seen: list[str] = []
    release = threading.Event()

    @registry.handler("wait")
    async def wait(job):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(f"{job.id} cancelled")
            raise

    @registry.handler("deaf")
    async def deaf(job):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(f"{job.id} swallowed")  # and returns normally

    @registry.handler("block")
    def block(job):
        seen.append(f"{job.id} started")
        release.wait(10)
        seen.append(f"{job.id} returned")

    return registry, seen, release


def cancelled(rec, job_id):
    outcome = rec.outcomes.get(job_id)
    return (
        outcome is not None
        and outcome.status == "cancelled"
        and rec.kinds[job_id] is FailureKind.CANCELLED
    )


def test_an_async_handler_is_cancelled_and_its_job_ends_cancelled_even_on_its_last_attempt():
    registry, seen, _ = registry_with_waits()
    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "wait", attempts=5, max_attempts=5), job(2, "wait")])
        await asyncio.sleep(0)
        assert executor.cancel([1]) == 1
        await wait_until_async(lambda: executor.in_flight == 1, 5, "job 1 ended", interval_s=0.005)
        assert executor.cancel([1, 99]) == 0  # gone, or never ours: nothing to do
        executor.cancel([2])
        await wait_until_async(lambda: executor.in_flight == 0, 5, "job 2 ended", interval_s=0.005)

    run_async(main())
    executor.close()
    assert sorted(seen) == ["1 cancelled", "2 cancelled"]
    # not 'failed' (attempts used up), not retried
    assert cancelled(rec, 1) and cancelled(rec, 2), rec.outcomes
    assert "the handler was interrupted" in rec.outcomes[1].error
    assert rec.completed_ids == []


def test_a_handler_that_swallows_the_cancellation_ends_cancelled_all_the_same():
    registry, seen, _ = registry_with_waits()
    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "deaf")])
        await asyncio.sleep(0)
        executor.cancel([1])
        await wait_until_async(lambda: executor.in_flight == 0, 5, "job 1 ended", interval_s=0.005)

    run_async(main())
    executor.close()
    assert seen == ["1 swallowed"]
    assert cancelled(rec, 1) and rec.completed_ids == []


def test_a_running_sync_handler_is_recorded_cancelled_on_return_and_a_waiting_one_never_starts():
    registry, seen, release = registry_with_waits()
    executor, rec = make(registry, sync_threads=1)

    async def main():
        # one thread: job 2 waits for it, unstarted
        executor.start([job(1, "block"), job(2, "block")])
        await wait_until_async(lambda: seen == ["1 started"], 5, "job 1 started", interval_s=0.005)
        assert executor.cancel([1, 2]) == 2
        # Job 2 had not started: cancelled now, its slot freed. Job 1's thread cannot be stopped: it
        # keeps running (and its lease: still due for heartbeats), with no outcome yet.
        await wait_until_async(
            lambda: executor.in_flight == 1, 5, "job 2 was dropped", interval_s=0.005
        )
        assert cancelled(rec, 2) and "it had not started" in rec.outcomes[2].error
        assert 1 not in rec.outcomes and [j.id for j in executor.running_since(1e18)] == [1]
        release.set()
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "job 1 returned", interval_s=0.005
        )

    run_async(main())
    executor.close()
    assert seen == ["1 started", "1 returned"], "job 2 must never start"
    assert cancelled(rec, 1) and "a thread cannot be interrupted" in rec.outcomes[1].error
    assert rec.completed_ids == [], (
        "the sync handler returned normally, after the cancel was seen: cancelled"
    )


def test_a_job_whose_lease_is_lost_is_not_cancelled_by_us():
    """The lease is gone: the new owner decides, nothing of ours is written (a cancel included)."""
    registry, _seen, _ = registry_with_waits()
    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "wait")])
        await asyncio.sleep(0)
        assert executor.lose([1], "taken over") == 1
        assert executor.cancel([1]) == 0
        await wait_until_async(lambda: executor.in_flight == 0, 5, "job 1 ended", interval_s=0.005)

    run_async(main())
    executor.close()
    assert rec.outcomes == {} and rec.completed_ids == []
