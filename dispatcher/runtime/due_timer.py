"""The due timer: one pending wake-up at the earliest known `run_at` of a job not due yet.

Why: a delayed job would otherwise start at the next idle poll, up to poll_interval_s (1 s by
default, jittered +-20%) after its run_at. With this timer it starts within a claim round trip
(~1-5 ms) of it, and the poll can stay at 1 s or more.

Where the run_at comes from (producer.py): a delayed job's NOTIFY carries its milliseconds until
run_at (no query at all), and after a due-timer or bulk wake-up, an assignment change or a poll
(at most once a second from polls) the producer asks the database once (store.jobs_next_due_in)
for jobs scheduled before it started, in buckets it just gained, or whose NOTIFY was missed.

Clocks: the database clock rules. Delays arrive as "seconds from now" measured by the database
(`run_at - clock_timestamp()` / `run_at - now()`), and the deadline is that delay from the
moment we receive it, on the event loop's monotonic clock: we never compare our wall clock with
the database's. The delay's transit (sub-millisecond locally) makes us that much late, never early.
Never early on our side either: uvloop runs timers on a clock cached at the start of each loop
iteration and in whole milliseconds, so a timer may fire a millisecond or more before its
deadline; a claim sent then saw the job not due yet (its now() < run_at), and the look-ahead
that followed no longer saw it as future: the job waited for some other wake-up (the latency
bench's p99 was 36-45 ms, max 135 ms, for a p50 of 1-1.4 ms). So the deadline is kept on
time.monotonic(), and a timer that fires before it is armed again for the rest.

One timer only: arming a later deadline than the pending one is a no-op, an earlier one replaces
it. When it fires, the next deadline is learnt by asking the database (producer.py), so no queue of
timers is kept. A far deadline costs nothing while pending (a heap entry in the event loop), and it
guarantees the wake-up even when NOTIFY wake-ups keep restarting the poll timer.
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
        self._clock: Callable[[], float] = scheduler.time if scheduler is not None else time.monotonic
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
        self._handle = scheduler.call_at(scheduler.time() + (deadline - self._clock()) + slack_s, self._fire)

    def _fire(self) -> None:
        deadline = self._deadline
        if deadline is not None and self._clock() < deadline:
            # Fired early (module docstring): wait for the rest, plus RETRY_SLACK_S, so that a
            # remainder below the loop's millisecond does not come back at once, again and again.
            self._schedule(deadline, RETRY_SLACK_S)
            return
        self._handle = self._deadline = None
        self._on_due()
