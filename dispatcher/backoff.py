"""Retry delays: exponential backoff with full jitter, capped.

Full jitter (AWS architecture blog, "Exponential Backoff And Jitter") draws the delay uniformly
from [0, bound] with bound = min(cap, base * 2^(attempt-1)): it spreads a burst of failures (200k
jobs failing against one broken dependency) evenly instead of retrying them in synchronised waves.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# Floor on a drawn delay so a retry is always strictly in the future, even when the draw is 0.
MIN_RETRY_DELAY_S = 0.001


def retry_bound_s(attempt: int, base_s: float, cap_s: float) -> float:
    """Upper bound of the delay after failed attempt number `attempt` (1-based)."""
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base is past any sane cap; avoid huge floats
    return min(cap_s, base_s * (2.0**exponent))


def retry_delay_s(
    attempt: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random
) -> float:
    return max(MIN_RETRY_DELAY_S, retry_bound_s(attempt, base_s, cap_s) * rand())


def jittered(interval_s: float, spread: float = 0.1, rand: Callable[[], float] = random.random) -> float:
    """interval_s +/- spread (10% default): periodic loops in N pods must not fire in lockstep."""
    return interval_s * (1.0 - spread + 2.0 * spread * rand())
