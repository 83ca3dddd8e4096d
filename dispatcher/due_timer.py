"""The due timer: one pending wake-up at the earliest known `run_at` of a job not due yet.

Why: a delayed job would otherwise start at the next idle poll, up to poll_interval_s (1 s by
default, jittered +-20%) after its run_at. With this timer it starts within a claim round trip
(~1-5 ms) of it, and the poll can stay at 1 s or more.

Where the run_at comes from (producer.py): a delayed job's NOTIFY carries its milliseconds until
run_at (no query at all), and after a poll, a due-timer or bulk wake-up or an assignment change
the producer asks the database once (store.jobs_next_due_in) for jobs scheduled before it started,
in buckets it just gained, or whose NOTIFY was missed.

Clocks: the database clock rules. Delays arrive as "seconds from now" measured by the database
(`run_at - clock_timestamp()` / `run_at - now()`), and the deadline is that delay from the
moment we receive it, on the event loop's monotonic clock: we never compare our wall clock with
the database's. The delay's transit (sub-millisecond locally) makes us that much late, never early.

One timer only: arming a later deadline than the pending one is a no-op, an earlier one replaces
it. When it fires, the next deadline is learnt by asking the database (producer.py), so no queue of
timers is kept. A far deadline costs nothing while pending (a heap entry in the event loop), and it
guarantees the wake-up even when NOTIFY wake-ups keep restarting the poll timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


class _Scheduler(Protocol):
    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle: ...


class DueTimer:
    def __init__(self, on_due: Callable[[], None], scheduler: _Scheduler | None = None) -> None:
        self._on_due = on_due
        self._scheduler = scheduler
        self._handle: asyncio.TimerHandle | None = None

    @property
    def deadline(self) -> float | None:
        """When the pending timer fires (scheduler time), or None."""
        return None if self._handle is None else self._handle.when()

    def arm(self, due_in_s: float) -> bool:
        """Wake up in `due_in_s` seconds unless the pending timer fires no later; returns whether
        the timer was (re)armed."""
        scheduler = self._scheduler or asyncio.get_running_loop()
        deadline = scheduler.time() + max(0.0, due_in_s)
        if self._handle is not None:
            if self._handle.when() <= deadline:
                return False
            self._handle.cancel()
        self._handle = scheduler.call_at(deadline, self._fire)
        return True

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._on_due()
