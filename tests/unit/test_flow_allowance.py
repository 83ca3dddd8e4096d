"""The gated claim's choice (dispatcher/db/claims.py), as pure functions: how many jobs may start
under a set of limit rows, and a token bucket driven by it never starting more than its rate and
burst allow in any window, nor falling behind its rate while jobs wait."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.db.claims import allowance, next_token_s
from dispatcher.db.rows import Gate, Limit, TypeFilter
from dispatcher.runtime.flow_control import plan_for


def test_the_tightest_row_binds_and_says_which_kind_it_is():
    assert allowance([]) == (None, None)
    assert allowance([(10, 3, None)]) == (7, "max_running")
    assert allowance([(10, 3, 2.7)]) == (2, "per_second")
    assert allowance([(10, 12, None)]) == (0, "max_running")  # lowered below what runs: none start
    assert allowance([(None, 0, 5.0), (4, 1, None)]) == (3, "max_running")
    assert allowance([(None, 0, 0.4)]) == (0, "per_second")


def test_the_next_token_comes_when_the_fraction_left_grows_to_one():
    assert next_token_s(3.0, 3, 10.0) == 0.1
    assert math.isclose(next_token_s(2.5, 2, 10.0), 0.05)
    assert next_token_s(5.0, 2, 10.0) == 0.0  # whole tokens left: no wait


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 200.0),
    burst_extra=st.floats(0.0, 50.0),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=200),
    asks=st.integers(1, 50),
)
def test_a_token_bucket_driven_by_allowance_never_exceeds_rate_times_window_plus_burst(
    rate, burst_extra, gaps, asks
):
    """Claims at arbitrary times, each asking for `asks`: over any window [a, b] between two
    starts, at most rate x (b - a) + burst start (the bound the concept page documents)."""
    burst = max(1.0, rate) + burst_extra
    tokens, last, now = burst, 0.0, 0.0
    starts: list[float] = []
    for gap in gaps:
        now += gap
        tokens = min(burst, tokens + (now - last) * rate)
        last = now
        allowed, _ = allowance([(None, 0, tokens)])
        taken = min(asks, allowed)
        tokens -= taken
        starts += [now] * taken
        assert tokens >= -1e-9
    for i, a in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= rate * (starts[j] - a) + burst + 1e-6


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1.0, 100.0), horizon_s=st.floats(2.0, 20.0))
def test_with_a_backlog_a_claimer_that_wakes_at_next_token_keeps_up_with_the_rate(rate, horizon_s):
    """A worker that claims, and sleeps until next_token_s when held back, starts at least
    rate x horizon jobs over the horizon (from a full bucket: at most one burst more)."""
    burst = max(1.0, rate)
    tokens, now, started = burst, 0.0, 0
    while now < horizon_s:
        allowed, _ = allowance([(None, 0, tokens)])
        started += allowed
        wait = next_token_s(tokens, allowed, rate)
        tokens -= allowed
        step = max(wait, 1e-3)
        now += step
        tokens = min(burst, tokens + step * rate)
    assert started >= rate * horizon_s * 0.99 - 1


def test_the_plan_gates_each_limited_type_and_keeps_the_rest_off_them():
    limits = (
        Limit("sms", "*", 5, None),
        Limit("push", "default", None, 10.0),
        Limit("*", "bulk", 2, None),
    )
    assert plan_for(limits, "other") is not None  # sms's limit is in every queue
    default = plan_for(limits, "default")
    assert default.ungated and default.rest == TypeFilter(("push", "sms"), False)
    assert [g.types.types for g in default.gates] == [("push",), ("sms",)]
    bulk = plan_for(limits, "bulk")
    assert not bulk.ungated  # a '*' limit gates every type of the queue
    assert bulk.gates[-1] == Gate(TypeFilter(("sms",), False), (("*", "bulk"),))
    assert bulk.gates[0].keys == (("*", "bulk"), ("sms", "*"))
    assert plan_for((Limit("sms", "eu", 1, None),), "us") is None
