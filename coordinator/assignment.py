"""The interface between a worker and whatever decides which buckets it polls.

`owned()` (which buckets now) and `changed` (an event to wake on); `on_revoke` is awaited before
buckets are handed over, as Kafka's rebalance listener. `static` lives here; the membership-based
backends come with the coordinator. Ownership decides who polls, never who may write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from .buckets import NUM_BUCKETS

# Called with the buckets about to be handed over (already gone from `owned()`); the hand-over
# waits for it to return (bounded: a stuck or failing callback delays it, never blocks it).
OnRevoke = Callable[[tuple[int, ...]], Awaitable[None]]


class BucketAssignment(Protocol):
    changed: asyncio.Event

    async def start(self, on_revoke: OnRevoke | None = None) -> None: ...

    def owned(self) -> tuple[int, ...] | None:
        """Buckets to poll now; None means degraded (claim everything with SKIP LOCKED)."""

    async def stop(self) -> None: ...


class StaticAssignment:
    """A fixed bucket set, e.g. `DISPATCHER_BUCKETS=0-15` or worker i of N (`i, i+N, i+2N, ...`)."""

    def __init__(self, buckets: tuple[int, ...]) -> None:
        bad = [b for b in buckets if not 0 <= b < NUM_BUCKETS]
        if bad:
            raise ValueError(f"buckets out of range 0..{NUM_BUCKETS - 1}: {bad}")
        self._buckets = tuple(sorted(set(buckets)))
        self.changed = asyncio.Event()

    async def start(self, on_revoke: OnRevoke | None = None) -> None:
        # on_revoke is never called: a static assignment never hands anything over
        self.changed.set()

    def owned(self) -> tuple[int, ...]:
        return self._buckets

    async def stop(self) -> None:
        return None
