"""The executor's decisions with a fake completer: every way an attempt ends becomes an outcome,
and no handler can take the process down."""

import asyncio
import contextlib
import threading
import time

import pytest

from dispatcher.api.registry import Registry
from dispatcher.errors import Cancel, PermanentJobError
from dispatcher.model import FailureKind, Job
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.sections import ExecutionSettings, LeaseSettings
from tests.helpers import run_async, wait_until_async


def job(job_id: int, job_type: str, attempts: int = 1, max_attempts: int = 5) -> Job:
    return Job(
        id=job_id,
        job_type=job_type,
        payload={},
        attempts=attempts,
        max_attempts=max_attempts,
        locked_at=None,
        bucket=0,
        priority=0,
        ordering_key=None,
        token="00000000-0000-0000-0000-000000000001",
    )


class Recorder:
    """Stands in for the Completer: keeps what the executor decided."""

    def __init__(self) -> None:
        self.completed_ids: list[int] = []
        self.outcomes: dict[int, object] = {}
        self.kinds: dict[int, object] = {}  # the FailureKind, for the outcome's log line
        self.summaries: dict[int, str | None] = {}
        self.halts: dict[int, bool] = {}  # a keyed job's final failure halts its key
        self.handed: dict[int, object] = {}  # jobs of a type without a handler here, handed back
        self.snoozes: dict[int, tuple[float, int] | None] = {}  # a Snooze: (seconds, cap)

    def completed(self, job, duration_s, result=None):
        self.completed_ids.append(job.id)

    def handed_back(self, back):
        self.handed[back.job.id] = back

    def failed(self, job, outcome, duration_s, *, kind, summary=None, halts=True, snooze=None):
        self.halts[job.id] = halts
        self.snoozes[job.id] = snooze
        self.outcomes[job.id] = outcome
        self.kinds[job.id] = kind
        self.summaries[job.id] = summary


def run_to_the_end(executor: Executor, jobs: list[Job]) -> None:
    """Start a batch on a fresh loop and wait until every attempt has ended."""

    async def main():
        executor.start(jobs)
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005
        )

    run_async(main())


def execution(*, job_timeout_s: float = 0, sync_threads: int = 2) -> ExecutionSettings:
    return ExecutionSettings("w1", job_timeout_s, sync_threads, retry_base_s=1.0, retry_cap_s=60.0)


def leases(
    lease_s: float = 30.0, *, start_margin_s: float = 0.0, lose_early_s: float = 0.0
) -> LeaseSettings:
    """The executor's lease margins (the worker derives them from the heartbeat interval)."""
    return LeaseSettings(lease_s, lease_s / 3, start_margin_s, lose_early_s)


def make(registry, **kw):
    recorder = Recorder()
    executor = Executor(
        registry,
        RetryPolicy(1.0, 60.0, rand=lambda: 0.5),
        recorder,
        execution(job_timeout_s=kw.pop("job_timeout_s", 0), sync_threads=kw.pop("sync_threads", 2)),
        leases(),
    )
    return executor, recorder


@pytest.mark.parametrize(
    "exc", [ValueError("boom"), SystemExit(3), KeyboardInterrupt(), GeneratorExit()]
)
def test_anything_an_async_handler_raises_is_its_jobs_failure(exc):
    registry = Registry()

    @registry.handler("bad")
    async def bad(job):
        await asyncio.sleep(0)
        raise exc

    @registry.handler("good")
    async def good(job):
        await asyncio.sleep(0)

    executor, rec = make(registry)

    run_to_the_end(executor, [job(1, "bad"), job(2, "good")])  # the process (this test) lives on
    assert rec.completed_ids == [2]
    outcome = rec.outcomes[1]
    assert (outcome.status, outcome.delay_s) == ("queued", 0.5)
    assert type(exc).__name__ in outcome.error


def test_a_handler_that_raises_without_awaiting_is_recorded_too():
    registry = Registry()

    @registry.handler("bad")
    async def bad(job):
        raise SystemExit("no await before this")

    executor, rec = make(registry)

    run_to_the_end(executor, [job(1, "bad")])
    assert "SystemExit: no await before this" in rec.outcomes[1].error


def test_anything_a_sync_handler_raises_is_its_jobs_failure():
    registry = Registry()

    @registry.handler("bad")
    def bad(job):
        raise SystemExit("from a thread")

    executor, rec = make(registry)

    run_to_the_end(executor, [job(1, "bad")])
    executor.close()
    assert (
        rec.outcomes[1].status == "queued" and "SystemExit: from a thread" in rec.outcomes[1].error
    )


def test_permanent_error_unknown_type_and_last_attempt():
    registry = Registry()

    @registry.handler("perm")
    async def perm(job):
        raise PermanentJobError("no such customer")

    @registry.handler("boom")
    async def boom(job):
        raise RuntimeError("boom")

    executor, rec = make(registry)

    run_to_the_end(
        executor, [job(1, "perm"), job(2, "nobody"), job(3, "boom", attempts=5, max_attempts=5)]
    )
    assert rec.outcomes[1].status == "discarded"
    # no handler here: never a failure, handed back for a worker that serves it (a rollout)
    assert 2 not in rec.outcomes and rec.handed[2].delay_s >= 1.6
    assert rec.handed[2].unserved is False, "nobody knows yet whether any worker serves it"
    assert rec.outcomes[3].status == "failed"
    # What the outcome lines say: why each attempt failed, and the exception in one line.
    assert rec.kinds == {1: FailureKind.PERMANENT, 3: FailureKind.ERROR}
    assert rec.summaries[1] == "dispatcher.errors.PermanentJobError: no such customer"
    assert rec.summaries[3] == "RuntimeError: boom"


def test_a_timeout_cancels_the_handler_and_backs_off():
    registry = Registry()
    cancelled = []

    @registry.handler("hang", timeout_s=0.05)
    async def hang(job):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(job.id)
            raise

    executor, rec = make(registry)

    run_to_the_end(executor, [job(1, "hang")])
    assert cancelled == [1] and executor.stats.timeouts == 1
    assert rec.kinds[1] is FailureKind.TIMEOUT
    assert rec.outcomes[1].error == "timed out after 0.05 s" and rec.outcomes[1].delay_s == 0.5


def test_the_sync_backlog_is_handed_back_unstarted_and_running_jobs_are_held():
    registry = Registry()
    release = threading.Event()
    started = []

    @registry.handler("block")
    def block(job):
        started.append(job.id)
        release.wait(10)

    executor, rec = make(registry, sync_threads=1)

    async def main():
        executor.start([job(1, "block"), job(2, "block"), job(3, "block")])
        await wait_until_async(lambda: started == [1], 5, "the first job started", interval_s=0.005)
        held = [j.id for j in executor.running_since(time.monotonic())]
        unstarted = [j.id for j in executor.take_unstarted()]
        in_flight = executor.in_flight
        release.set()
        await wait_until_async(
            lambda: executor.in_flight == 0, 5, "every attempt ended", interval_s=0.005
        )
        return held, unstarted, in_flight

    held, unstarted, in_flight = run_async(main())
    executor.close()
    assert sorted(held) == [1, 2, 3]
    assert unstarted == [2, 3] and in_flight == 1
    assert started == [1] and rec.completed_ids == [1]


def test_drain_interrupts_what_outlives_the_grace_and_retries_it_at_once():
    registry = Registry()

    @registry.handler("slow")
    async def slow(job):
        await asyncio.sleep(30)

    @registry.handler("quick")
    async def quick(job):
        await asyncio.sleep(0.01)

    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "slow"), job(2, "quick")])
        await executor.drain(time.monotonic() + 0.3)
        assert await executor.interrupt(2.0) == 0

    run_async(main())
    assert rec.completed_ids == [2]
    assert (rec.outcomes[1].status, rec.outcomes[1].delay_s) == ("queued", 0.0)
    assert rec.outcomes[1].error == "interrupted: worker shut down"
    assert rec.kinds[1] is FailureKind.INTERRUPTED
    assert executor.in_flight == 0


def test_a_handler_that_swallows_its_timeout_and_returns_is_still_timed_out():
    registry = Registry()

    @registry.handler("deaf", timeout_s=0.05)
    async def deaf(job):
        # ignores the timeout, then returns as if all went well
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)

    executor, rec = make(registry)

    run_to_the_end(executor, [job(1, "deaf")])
    assert rec.completed_ids == [] and rec.outcomes[1].error == "timed out after 0.05 s"
    assert executor.stats.timeouts == 1


def test_a_keyed_jobs_failure_carries_its_handlers_on_ordered_failure():
    registry = Registry()

    @registry.handler("halts")
    async def halts(job):
        raise ValueError("boom")

    @registry.handler("goes_on", on_ordered_failure="continue")
    def goes_on(job):
        raise ValueError("boom")

    executor, rec = make(registry)
    keyed = [
        Job(
            id=n,
            job_type=t,
            payload={},
            attempts=1,
            max_attempts=1,
            locked_at=None,
            bucket=0,
            priority=0,
            ordering_key="k",
            token="00000000-0000-0000-0000-000000000001",
        )
        for n, t in ((1, "halts"), (2, "goes_on"), (4, "missing"))
    ]
    run_to_the_end(executor, [*keyed, job(3, "goes_on")])
    assert rec.halts == {1: True, 2: False, 3: True}, "unkeyed: moot, sent as the default"
    assert [rec.outcomes[n].status for n in (1, 2)] == ["failed"] * 2
    assert 4 in rec.handed and 4 not in rec.outcomes, "no handler: handed back, its key kept"


def test_a_handler_that_raises_cancel_ends_its_job_cancelled_whatever_attempts_are_left():
    registry = Registry()

    @registry.handler("refund")
    async def refund(job):
        raise Cancel("the order was refunded")

    @registry.handler("refund_sync")
    def refund_sync(job):
        raise Cancel()

    executor, rec = make(registry)
    run_to_the_end(executor, [job(1, "refund", attempts=1, max_attempts=5), job(2, "refund_sync")])
    assert rec.outcomes[1].status == "cancelled" and rec.outcomes[2].status == "cancelled"
    assert rec.outcomes[1].error == "cancelled by its handler: the order was refunded"
    assert rec.kinds == {1: FailureKind.CANCELLED_BY_HANDLER, 2: FailureKind.CANCELLED_BY_HANDLER}
