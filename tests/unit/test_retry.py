"""The one retry policy: every kind of failed attempt, decided without I/O."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.backoff import MIN_RETRY_DELAY_S, retry_bound_s
from dispatcher.constants import LAST_ERROR_MAX_CHARS
from dispatcher.model import FailureKind, Outcome
from dispatcher.runtime.retry import RetryPolicy, cut_error, lease_expired_error

POLICY = RetryPolicy(base_s=1.0, cap_s=900.0, rand=lambda: 0.5)
BACKOFF_KINDS = (FailureKind.ERROR, FailureKind.TIMEOUT, FailureKind.LEASE_EXPIRED)


@pytest.mark.parametrize("kind", BACKOFF_KINDS)
def test_a_retryable_failure_backs_off_exponentially(kind):
    delays = [POLICY.decide(kind, attempt, 20, "boom").delay_s for attempt in (1, 2, 3, 4)]
    assert delays == [0.5, 1.0, 2.0, 4.0]  # half (rand=0.5) of 1, 2, 4, 8 s
    assert POLICY.decide(kind, 3, 20, "boom").status == "queued"


@pytest.mark.parametrize("kind", [*BACKOFF_KINDS, FailureKind.INTERRUPTED])
def test_the_last_attempt_fails_for_good(kind):
    assert POLICY.decide(kind, 5, 5, "boom") == Outcome("failed", 0.0, "boom")
    assert POLICY.decide(kind, 6, 5, "boom").status == "failed"  # max_attempts lowered meanwhile


def test_a_permanent_error_is_discarded_whatever_the_attempt():
    assert POLICY.decide(FailureKind.PERMANENT, 1, 20, "no such customer") == Outcome(
        "discarded", 0.0, "no such customer"
    )
    assert POLICY.decide(FailureKind.PERMANENT, 20, 20, "x").status == "discarded"


def test_an_unknown_job_type_fails_at_once():
    assert POLICY.decide(FailureKind.UNKNOWN_TYPE, 1, 20, "no handler").status == "failed"


def test_an_interrupted_attempt_is_retried_at_once_and_still_counts():
    assert POLICY.decide(FailureKind.INTERRUPTED, 1, 3, "shutdown") == Outcome(
        "queued", 0.0, "shutdown"
    )
    assert POLICY.decide(FailureKind.INTERRUPTED, 3, 3, "shutdown").status == "failed"


def test_the_error_text_is_bounded_and_keeps_the_exception_line_at_its_end():
    traceback = "Traceback (most recent call last):\n" + "  frame\n" * 2_000 + "ValueError: bad"
    outcome = POLICY.decide(FailureKind.ERROR, 1, 2, traceback)
    assert len(outcome.error) == LAST_ERROR_MAX_CHARS
    assert outcome.error.startswith("Traceback") and outcome.error.endswith("ValueError: bad")


@given(st.text(max_size=5_000), st.integers(10, 3_000))
def test_a_cut_error_is_within_its_bound_and_untouched_when_it_fits(error, limit):
    cut = cut_error(error, limit)
    assert len(cut) <= limit
    assert cut == error if len(error) <= limit else cut.endswith(error[-1])


@given(
    attempt=st.integers(1, 200),
    extra=st.integers(1, 50),
    base=st.floats(0.001, 100),
    cap_factor=st.floats(1, 1000),
    draw=st.floats(0, 1),
    kind=st.sampled_from(BACKOFF_KINDS),
)
def test_every_retry_is_in_the_future_and_within_its_bound(
    attempt, extra, base, cap_factor, draw, kind
):
    policy = RetryPolicy(base, base * cap_factor, rand=lambda: draw)
    outcome = policy.decide(kind, attempt, attempt + extra, "e")
    assert outcome.retried
    assert (
        MIN_RETRY_DELAY_S
        <= outcome.delay_s
        <= max(MIN_RETRY_DELAY_S, retry_bound_s(attempt, base, base * cap_factor))
    )


def test_lease_expired_error_says_how_often_and_who_held_it():
    assert lease_expired_error(1, "pod-a", "12:00") == (
        "lease expired once: its worker died or stalled (last held by pod-a since 12:00)"
    )
    assert lease_expired_error(3, None, None).startswith(
        "lease expired 3 times: its worker died or stalled"
    )


@pytest.mark.parametrize("attempts, max_attempts", [(1, 20), (20, 20), (25, 20)])
def test_a_cancelled_job_ends_cancelled_whatever_the_attempt(attempts, max_attempts):
    """An operator's cancel is never retried, and never turned into 'failed' by a used-up attempt
    count."""
    assert POLICY.decide(
        FailureKind.CANCELLED, attempts, max_attempts, "cancelled: asked"
    ) == Outcome("cancelled", 0.0, "cancelled: asked")
    assert not POLICY.decide(FailureKind.CANCELLED, attempts, max_attempts, "x").retried
