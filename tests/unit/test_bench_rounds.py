"""The interval for a median of benchmark rounds (bench/rounds.py)."""

import random

import pytest

from bench.rounds import median_interval


def test_nine_rounds_drop_the_two_extremes_on_each_side_for_96_percent():
    # n = 9: P(Bin(9, 1/2) <= 1) = 10/512, so [x(2), x(8)] covers the median with 1 - 20/512
    values = [1.3, 0.7, 1.0, 0.9, 1.1, 0.8, 1.2, 0.95, 1.05]
    assert median_interval(values) == (0.8, 1.2, 0.961)


def test_too_few_rounds_give_min_and_max_with_their_smaller_coverage():
    assert median_interval([1.2, 0.9, 1.0]) == (0.9, 1.2, 0.75)
    assert median_interval([1.0]) == (1.0, 1.0, 0.0)


def test_five_rounds_reach_90_percent_only_with_min_and_max():
    assert median_interval([5, 1, 4, 2, 3]) == (1, 5, 0.938)


def test_the_coverage_is_what_sampling_gives():
    """Draw rounds from a skewed distribution whose median is known: the interval must hold it
    at least as often as it says (within sampling error), and not much more."""
    rng = random.Random(7)
    true_median = 1.0  # of exp(N(0, 0.3)): exp(0)
    n, trials, held = 7, 4000, 0
    for _ in range(trials):
        low, high, coverage = median_interval([rng.lognormvariate(0, 0.3) for _ in range(n)])
        held += low <= true_median <= high
    assert coverage == 0.984  # n = 7: [x(1), x(7)]; [x(2), x(6)] covers only 0.875
    assert abs(held / trials - coverage) < 0.01


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no values"):
        median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0], confidence=1.0)
