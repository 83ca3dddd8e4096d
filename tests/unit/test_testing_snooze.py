"""dispatcher.testing's Runner with Snooze and a handler's own retry settings: what a user's unit
test sees is what a worker does (tests/integration/test_handler_retries.py)."""

from datetime import timedelta

import dispatcher
from dispatcher import Snooze
from tests.unit.test_testing import T0, make


def test_a_snooze_is_due_later_spends_no_attempt_and_past_max_snoozes_fails_like_an_error() -> None:
    store, registry, runner = make(max_snoozes=2, retry_base_s=1.0, rand=lambda: 1.0)

    @registry.handler("wait")
    def wait(job):
        raise Snooze(60, "not yet")

    job_id = dispatcher.enqueue_sync(store, "wait", max_attempts=2)
    [first] = runner.run_due()
    assert (first.status, first.snoozed, first.attempt, first.error) == (
        "queued",
        True,
        1,
        "snoozed for 60 s: not yet",
    )
    state = store.get(job_id)
    assert state is not None and (state.attempts, state.snoozes, state.run_at) == (
        0,
        1,
        T0 + timedelta(seconds=60),
    )
    ran = runner.drain()
    assert [(a.attempt, a.status, a.snoozed) for a in ran] == [
        (1, "queued", True),
        (1, "queued", False),
        (2, "failed", False),
    ]
    assert (
        ran[-1].error
        == "snoozed 2 times (DISPATCHER_MAX_SNOOZES), and again: snoozed for 60 s: not yet"
    )


def test_a_handlers_max_attempts_and_retry_callable_apply_to_jobs_enqueued_without_one() -> None:
    store, registry, runner = make()

    @registry.handler("own", max_attempts=2, retry=lambda attempt, error: 5.0)
    def own(job):
        raise ValueError("boom")

    mine = dispatcher.enqueue_sync(store, "own")
    given = dispatcher.enqueue_sync(store, "own", max_attempts=3)
    runner.run_due()
    assert {store.get(i).run_at for i in (mine, given)} == {T0 + timedelta(seconds=5)}  # type: ignore[union-attr]
    runner.drain()
    assert (store.get(mine).attempts, store.get(given).attempts) == (2, 3)  # type: ignore[union-attr]
