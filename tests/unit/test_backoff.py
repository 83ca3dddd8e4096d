import itertools

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.backoff import MIN_RETRY_DELAY_S, jittered, retry_bound_s, retry_delay_s


def test_bound_doubles_then_caps():
    bounds = [retry_bound_s(n, 1.0, 900.0) for n in range(1, 14)]
    assert bounds[:5] == [1, 2, 4, 8, 16]
    assert bounds[-1] == 900.0
    assert all(a <= b for a, b in itertools.pairwise(bounds))


@given(
    attempt=st.integers(1, 10_000),
    base=st.floats(0.001, 100),
    cap_factor=st.floats(1, 10_000),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_delay_is_positive_and_within_bound(attempt, base, cap_factor, draw):
    cap = base * cap_factor
    delay = retry_delay_s(attempt, base, cap, rand=lambda: draw)
    assert delay >= MIN_RETRY_DELAY_S
    assert delay <= max(MIN_RETRY_DELAY_S, retry_bound_s(attempt, base, cap))


def test_full_jitter_spans_the_whole_range():
    assert retry_delay_s(5, 1.0, 900.0, rand=lambda: 0.999999) > 15.9
    assert retry_delay_s(5, 1.0, 900.0, rand=lambda: 0.0) == MIN_RETRY_DELAY_S


@given(st.floats(0, 1, exclude_max=True))
def test_jittered_stays_within_ten_percent(draw):
    assert 0.9 <= jittered(1.0, rand=lambda: draw) <= 1.1
