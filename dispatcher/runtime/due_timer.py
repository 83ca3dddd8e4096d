"""The due timer: one pending wake-up at the earliest known `run_at` of a job not due yet.

So a delayed job starts within a claim's round trip of its run_at, not at the next poll. The
deadline is a delay measured by the database, kept on time.monotonic(), and re-armed if the loop
fires early (uvloop). Why: docs/design/claims.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

# uvloop's timers may fire up to ~2 ms early: a delay truncated to whole milliseconds, counted on
# a clock floored to them. A re-armed timer waits that much longer, so it fires once more at most.
RETRY_SLACK_S = 0.002


class _Scheduler(Protocol):
    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle: ...


class DueTimer:
    def __init__(self, on_due: Callable[[], None], scheduler: _Scheduler | None = None) -> None:
        self._on_due = on_due
        self._scheduler = scheduler
        # The deadline's clock: the true monotonic clock, or a fake scheduler's own (tests).
        self._clock: Callable[[], float] = (
            scheduler.time if scheduler is not None else time.monotonic
        )
        self._handle: asyncio.TimerHandle | None = None
        self._deadline: float | None = None

    @property
    def deadline(self) -> float | None:
        """When the pending wake-up is due (on the timer's clock), or None."""
        return self._deadline

    def arm(self, due_in_s: float) -> bool:
        """Wake up in `due_in_s` seconds unless the pending timer fires no later; returns whether
        the timer was (re)armed."""
        deadline = self._clock() + max(0.0, due_in_s)
        if self._deadline is not None and self._deadline <= deadline:
            return False
        self.cancel()
        self._deadline = deadline
        self._schedule(deadline)
        return True

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._deadline = None

    def _schedule(self, deadline: float, slack_s: float = 0.0) -> None:
        scheduler = self._scheduler or asyncio.get_running_loop()
        self._handle = scheduler.call_at(
            scheduler.time() + (deadline - self._clock()) + slack_s, self._fire
        )

    def _fire(self) -> None:
        deadline = self._deadline
        if deadline is not None and self._clock() < deadline:
            # Fired early (docs/design/claims.md): wait for the rest, plus RETRY_SLACK_S, so that a
            # remainder below the loop's millisecond does not come back at once, again and again.
            self._schedule(deadline, RETRY_SLACK_S)
            return
        self._handle = self._deadline = None
        self._on_due()
