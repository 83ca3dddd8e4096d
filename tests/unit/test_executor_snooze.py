"""Snooze and a handler's own retry settings as the executor carries them out (fake completer, real
tasks and threads): a snooze goes to the completer with its seconds and the cap, and the failed
attempt it becomes past the cap; an operator's cancel wins over a snooze."""

import asyncio

import pytest

from dispatcher import Registry, Snooze
from dispatcher.model import FailureKind
from tests.helpers import run_async, wait_until_async
from tests.unit.test_executor import job, make, run_to_the_end


@pytest.mark.parametrize("is_async", [True, False])
def test_a_snooze_reaches_the_completer_with_its_seconds_and_the_cap(is_async):
    registry = Registry()
    if is_async:

        @registry.handler("later")
        async def later(job):
            await asyncio.sleep(0)
            raise Snooze(30, "the API says 429")
    else:

        @registry.handler("later")
        def later_sync(job):
            raise Snooze(30, "the API says 429")

    executor, rec = make(registry)
    run_to_the_end(executor, [job(1, "later", attempts=2, max_attempts=5)])
    assert rec.snoozes[1] == (30.0, 100)
    assert (
        rec.kinds[1] is FailureKind.ERROR
        and rec.summaries[1] == "snoozed for 30 s: the API says 429"
    )
    # What is written past DISPATCHER_MAX_SNOOZES: an ordinary failed attempt, retried by the
    # policy.
    outcome = rec.outcomes[1]
    assert outcome.status == "queued" and outcome.delay_s == 1.0
    assert (
        outcome.error == "snoozed 100 times (DISPATCHER_MAX_SNOOZES), and again: snoozed for 30 s: "
        "the API says 429"
    )


def test_a_snooze_with_a_bad_duration_is_the_handlers_error():
    registry = Registry()

    @registry.handler("bad")
    async def bad(job):
        raise Snooze(-5)

    executor, rec = make(registry)
    run_to_the_end(executor, [job(1, "bad")])
    assert rec.snoozes[1] is None
    assert (
        rec.outcomes[1].status == "queued"
        and "Snooze(seconds) must be a number" in rec.outcomes[1].error
    )


def test_a_job_an_operator_cancels_ends_cancelled_even_if_its_handler_then_snoozes():
    registry = Registry()

    @registry.handler("wait")
    async def wait(job):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise Snooze(10) from None

    executor, rec = make(registry)

    async def main():
        executor.start([job(1, "wait")])
        await asyncio.sleep(0)
        assert executor.cancel([1]) == 1
        await wait_until_async(lambda: executor.in_flight == 0, 5, "job 1 ended", interval_s=0.005)

    run_async(main())
    assert rec.outcomes[1].status == "cancelled" and rec.snoozes[1] is None


def test_a_handlers_retry_settings_decide_its_failed_attempts():
    registry = Registry()
    seen = []

    @registry.handler(
        "own", max_attempts=3, retry=lambda attempt, error: seen.append(type(error)) or 7.0
    )
    async def own(job):
        raise RuntimeError("boom")

    executor, rec = make(registry)
    run_to_the_end(
        executor,
        [
            job(1, "own", attempts=2, max_attempts=None),
            job(2, "own", attempts=3, max_attempts=None),
            job(3, "own", attempts=3, max_attempts=10),
        ],
    )
    assert (rec.outcomes[1].status, rec.outcomes[1].delay_s) == ("queued", 7.0)
    assert rec.outcomes[2].status == "failed", (
        "the handler's max_attempts, the job having none of its own"
    )
    assert rec.outcomes[3].status == "queued", "the job's own max_attempts wins"
    assert seen == [RuntimeError, RuntimeError]
