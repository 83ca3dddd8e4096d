"""A clock that moves only when a test says so: retries and leases come due without sleeping.

One `FakeClock` is both the in-memory store's database clock (`now()`, an aware datetime) and a
stand-in for `time.monotonic` (calling it gives seconds), which the executor and the lease keeper
take as their `clock` parameter.
"""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    """Starts at `start` (default: the real time now) and moves by `advance(seconds)` only."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self._start = start or datetime.now(UTC)
        self._elapsed = 0.0
        self._lock = threading.Lock()  # handlers of a sync test runner may read it from threads

    def __call__(self) -> float:
        """Seconds since the clock was made, like time.monotonic (an arbitrary origin)."""
        return self._elapsed

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise ValueError(
                f"a clock only moves forward by a finite number of seconds, got {seconds!r}"
            )
        with self._lock:
            self._elapsed += seconds

    def advance_to(self, when: datetime) -> None:
        """Move to `when` (an aware datetime), or not at all if it is not in the future."""
        self.advance(max(0.0, (when - self.now()).total_seconds()))
        while self.now() < when:  # now() is rounded to microseconds, like a timestamptz
            self.advance(1e-6)
