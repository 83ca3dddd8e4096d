"""How far to trust a median of a few rounds: a distribution-free interval for it.

A cold start or a burst on 2 shared cores moves by up to +-30% from round to round, so the median
of 5-9 round ratios is itself uncertain. The interval is the classic one from order statistics:
with n rounds sorted, [x(k), x(n+1-k)] holds the true median with probability
1 - 2 * P(Binomial(n, 1/2) <= k - 1), whatever the distribution of a round. It needs no model of
the noise, which is not normal here (a round that collides with an autovacuum is an outlier).
"""

from __future__ import annotations

from math import comb


def median_interval(values: list[float], confidence: float = 0.9) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest order-statistic interval for the median of `values`
    whose coverage is at least `confidence`, or, with too few values for that (fewer than 5 at
    0.9), the widest one there is, [min, max], and its smaller coverage (3 values: 0.75)."""
    if not values:
        raise ValueError("no values")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    ordered = sorted(values)
    n = len(ordered)

    def coverage(k: int) -> float:  # of [x(k), x(n+1-k)], 1-based
        return 1 - 2 * sum(comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], round(coverage(k), 3)
