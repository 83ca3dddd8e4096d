"""A handler's own retry settings and Snooze: the options checked at decoration, and the policy's
choice of limit and delay (an enqueue-given max_attempts wins; a retry= callable's delay is used
when valid; every retry is in the future)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher import Registry, Snooze
from dispatcher.backoff import (
    MAX_RETRY_DELAY_S,
    MIN_RETRY_DELAY_S,
    HandlerRetry,
    handler_retry,
    retry_bound_s,
)
from dispatcher.constants import DEFAULT_MAX_ATTEMPTS
from dispatcher.errors import MAX_SNOOZE_S
from dispatcher.model import FailureKind
from dispatcher.runtime.retry import RetryPolicy

POLICY = RetryPolicy(base_s=1.0, cap_s=900.0, rand=lambda: 0.5)


# -- options, checked when the handler is declared -------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_attempts": 0}, "max_attempts must be an integer in 1..1000000"),
        ({"max_attempts": 2.5}, "max_attempts must be an integer"),
        ({"max_attempts": True}, "max_attempts must be an integer"),
        ({"retry_base_s": 0}, "retry_base_s must be a number of seconds > 0"),
        ({"retry_base_s": math.nan}, "retry_base_s must be a number of seconds > 0"),
        ({"retry_cap_s": math.inf}, "retry_cap_s must be a number of seconds > 0"),
        ({"retry_cap_s": "60"}, "retry_cap_s must be a number of seconds > 0"),
        ({"retry_base_s": 10, "retry_cap_s": 5}, "retry_cap_s (5) must be >= retry_base_s (10)"),
    ],
)
def test_bad_handler_retry_options_are_refused_when_declared(options, message):
    registry = Registry()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        registry.handler("x", **options)
    assert len(registry) == 0


def test_a_retry_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="retry must be a callable"):
        Registry().handler("x", retry=5)  # type: ignore[arg-type]


def test_a_handler_without_retry_options_uses_the_workers():
    registry = Registry()

    @registry.handler("plain")
    async def plain(job): ...

    @registry.handler("own", max_attempts=3, retry_base_s=2.0)
    async def own(job): ...

    assert registry.retry_of("plain") is None and registry.retry_of("nobody") is None
    assert registry.retry_of("own") == HandlerRetry(3, 2.0, None, None)
    assert handler_retry() is None


# -- which limit applies ---------------------------------------------------------------------


@given(
    enqueued=st.one_of(st.none(), st.integers(1, 100)),
    handlers=st.one_of(st.none(), st.integers(1, 100)),
    attempt=st.integers(1, 120),
)
def test_an_enqueue_given_max_attempts_wins_then_the_handlers_then_the_default(
    enqueued, handlers, attempt
):
    retry = None if handlers is None else HandlerRetry(max_attempts=handlers)
    limit = (
        enqueued
        if enqueued is not None
        else handlers
        if handlers is not None
        else DEFAULT_MAX_ATTEMPTS
    )
    outcome = POLICY.decide(FailureKind.ERROR, attempt, enqueued, "boom", retry)
    assert outcome.status == ("failed" if attempt >= limit else "queued")
    assert outcome.max_attempts == limit


def test_the_reaper_and_a_timeout_use_the_handlers_limit_too():
    retry = HandlerRetry(max_attempts=2)
    for kind in (FailureKind.LEASE_EXPIRED, FailureKind.TIMEOUT, FailureKind.INTERRUPTED):
        assert POLICY.decide(kind, 1, None, "e", retry).status == "queued"
        assert POLICY.decide(kind, 2, None, "e", retry).status == "failed"


# -- which delay -----------------------------------------------------------------------------


def test_a_handlers_backoff_replaces_the_workers():
    retry = HandlerRetry(base_s=10.0, cap_s=25.0)
    assert [POLICY.decide(FailureKind.ERROR, n, None, "e", retry).delay_s for n in (1, 2, 3)] == [
        5.0,
        10.0,
        12.5,
    ]
    # Only a base: the worker's cap, raised to the base if below it.
    assert (
        POLICY.decide(FailureKind.ERROR, 1, None, "e", HandlerRetry(base_s=2000.0)).delay_s
        == 1000.0
    )


def test_a_retry_callable_gets_the_attempt_and_the_error_and_its_delay_is_used():
    seen = []

    def retry(attempt, error):
        seen.append((attempt, error))
        return 42.5

    error = ValueError("boom")
    outcome = POLICY.decide(FailureKind.ERROR, 3, None, "boom", HandlerRetry(delay=retry), error)
    assert (outcome.status, outcome.delay_s, outcome.error) == ("queued", 42.5, "boom")
    assert seen == [(3, error)]


@pytest.mark.parametrize(
    "answer, note",
    [
        (-1, "retry= returned -1, not seconds"),
        (math.nan, "retry= returned nan, not seconds"),
        (math.inf, "retry= returned inf, not seconds"),
        ("5", "retry= returned '5', not seconds"),
        (MAX_RETRY_DELAY_S * 2, "not seconds"),
        (True, "retry= returned True, not seconds"),
    ],
)
def test_a_retry_callable_answer_that_is_no_delay_falls_back_to_the_backoff_and_says_so(
    answer, note
):
    outcome = POLICY.decide(
        FailureKind.ERROR, 1, None, "boom", HandlerRetry(delay=lambda a, e: answer)
    )
    assert (outcome.status, outcome.delay_s) == ("queued", 0.5)
    assert note in outcome.error.splitlines()[0] and outcome.error.endswith("boom")


def test_a_retry_callable_that_raises_or_answers_none_gets_the_backoff():
    def broken(attempt, error):
        raise KeyError("oops")

    outcome = POLICY.decide(FailureKind.ERROR, 2, None, "boom", HandlerRetry(delay=broken))
    assert outcome.delay_s == 1.0 and outcome.error.startswith("[retry= raised KeyError")
    outcome = POLICY.decide(
        FailureKind.ERROR, 2, None, "boom", HandlerRetry(base_s=4.0, delay=lambda a, e: None)
    )
    assert (outcome.delay_s, outcome.error) == (4.0, "boom")


@given(
    attempt=st.integers(1, 200),
    answer=st.one_of(
        st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**9)
    ),
    base=st.floats(0.001, 100),
    draw=st.floats(0, 1),
)
def test_every_retry_of_a_handler_policy_is_in_the_future_and_bounded(attempt, answer, base, draw):
    policy = RetryPolicy(1.0, 900.0, rand=lambda: draw)
    outcome = policy.decide(
        FailureKind.ERROR,
        attempt,
        attempt + 1,
        "e",
        HandlerRetry(base_s=base, delay=lambda a, e: answer),
    )
    assert outcome.retried
    bound = max(
        MIN_RETRY_DELAY_S, retry_bound_s(attempt, base, max(900.0, base)), MAX_RETRY_DELAY_S
    )
    assert MIN_RETRY_DELAY_S <= outcome.delay_s <= bound


def test_interrupted_and_final_outcomes_ignore_the_callable():
    called = []
    retry = HandlerRetry(max_attempts=3, delay=lambda a, e: called.append(a) or 7.0)
    assert POLICY.decide(FailureKind.INTERRUPTED, 1, None, "e", retry).delay_s == 0.0
    assert POLICY.decide(FailureKind.ERROR, 3, None, "e", retry).status == "failed"
    assert POLICY.decide(FailureKind.PERMANENT, 1, None, "e", retry).status == "discarded"
    assert called == []


# -- Snooze ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf, "5", None, True, MAX_SNOOZE_S + 1])
def test_a_snooze_of_no_sensible_duration_is_a_value_error_in_the_handler(seconds):
    with pytest.raises(ValueError, match=r"Snooze\(seconds\) must be a number of seconds >= 0"):
        Snooze(seconds)


def test_a_snooze_says_for_how_long_and_why():
    assert str(Snooze(30, "rate limited")) == "snoozed for 30 s: rate limited"
    assert Snooze(0).seconds == 0.0 and str(Snooze(1.5)) == "snoozed for 1.5 s"
