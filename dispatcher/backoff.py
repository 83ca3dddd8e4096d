"""Retry delays: exponential backoff with full jitter, capped.

Full jitter (AWS architecture blog, "Exponential Backoff And Jitter") draws the delay uniformly
from [0, bound] with bound = min(cap, base * 2^(attempt-1)): it spreads a burst of failures (200k
jobs failing against one broken dependency) evenly instead of retrying them in synchronised waves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.constants import DEFAULT_MAX_ATTEMPTS

# Floor on a drawn delay so a retry is always strictly in the future, even when the draw is 0.
MIN_RETRY_DELAY_S = 0.001
# Longest delay a handler's own policy may ask for (a longer one is a unit mistake).
MAX_RETRY_DELAY_S = 30 * 86_400.0
MAX_HANDLER_ATTEMPTS = 1_000_000  # as enqueue's max_attempts (dispatcher/api/enqueue_checks.py)

# A handler's `retry=`: (attempt number, the exception or None) -> seconds before the next attempt,
# or None for the default backoff.
RetryFn = Callable[[int, BaseException | None], float | None]


def retry_bound_s(attempt: int, base_s: float, cap_s: float) -> float:
    """Upper bound of the delay after failed attempt number `attempt` (1-based)."""
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base is past any sane cap; avoid huge floats
    return min(cap_s, base_s * (2.0**exponent))


def retry_delay_s(
    attempt: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random
) -> float:
    return max(MIN_RETRY_DELAY_S, retry_bound_s(attempt, base_s, cap_s) * rand())


def jittered(
    interval_s: float, spread: float = 0.1, rand: Callable[[], float] = random.random
) -> float:
    """interval_s +/- spread (10% default): periodic loops in N pods must not fire in lockstep."""
    return interval_s * (1.0 - spread + 2.0 * spread * rand())


@dataclass(frozen=True, slots=True)
class HandlerRetry:
    """A handler's own retry settings (`@registry.handler(max_attempts=..., retry=...)`); a None
    field falls back to the worker's (DISPATCHER_RETRY_BASE_S, _CAP_S; 20 attempts)."""

    max_attempts: int | None = None  # used when the job was enqueued without max_attempts
    base_s: float | None = None
    cap_s: float | None = None
    delay: RetryFn | None = None

    def attempts_allowed(self, enqueued: int | None) -> int:
        """A job's max_attempts given at enqueue wins; else this handler's; else the default."""
        if enqueued is not None:
            return enqueued
        return self.max_attempts if self.max_attempts is not None else DEFAULT_MAX_ATTEMPTS


def handler_retry(
    max_attempts: object = None, base_s: object = None, cap_s: object = None, delay: object = None
) -> HandlerRetry | None:
    """Checked handler options (ValueError/TypeError naming the option), or None when none is
    set."""
    if max_attempts is not None and (
        type(max_attempts) is not int or not 1 <= max_attempts <= MAX_HANDLER_ATTEMPTS
    ):
        raise ValueError(
            f"max_attempts must be an integer in 1..{MAX_HANDLER_ATTEMPTS}, got {max_attempts!r}"
        )
    for option, value in (("retry_base_s", base_s), ("retry_cap_s", cap_s)):
        if value is not None and not is_delay_s(value, allow_zero=False):
            raise ValueError(
                f"{option} must be a number of seconds > 0 and at most {MAX_RETRY_DELAY_S:.0f}, "
                f"got {value!r}"
            )
    # object: what the user gave, checked above to be numbers of seconds
    if base_s is not None and cap_s is not None and cap_s < base_s:  # type: ignore[operator]
        raise ValueError(f"retry_cap_s ({cap_s}) must be >= retry_base_s ({base_s})")
    if delay is not None and not callable(delay):
        raise TypeError(
            f"retry must be a callable (attempt, error) -> seconds or None, got {delay!r}"
        )
    if max_attempts is None and base_s is None and cap_s is None and delay is None:
        return None
    return HandlerRetry(max_attempts, base_s, cap_s, delay)  # type: ignore[arg-type]  # checked above


def is_delay_s(value: object, *, allow_zero: bool = True) -> bool:
    """A number of seconds a retry may wait: finite, in 0..MAX_RETRY_DELAY_S (> 0 unless
    allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value >= 0 if allow_zero else value > 0) and value <= MAX_RETRY_DELAY_S
