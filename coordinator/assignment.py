"""The interface between a worker and whatever decides which buckets it polls.

The worker asks two things: which buckets do I own now (`owned()`), and wake me when that changes
(`changed`, an asyncio.Event the worker clears after reading). Backends implement it: `static` here
(a fixed range from config); membership-based ones (PostgreSQL, Redis) come with the coordinator.

Ownership only decides who *polls* a bucket. Correctness never rests on it: every claim re-checks
the row's status in the same statement and every completion checks the claim's token, so two
owners overlapping during a hand-off cost contention, never a duplicate.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from dispatcher.constants import NUM_BUCKETS


class BucketAssignment(Protocol):
    changed: asyncio.Event

    async def start(self) -> None: ...

    def owned(self) -> tuple[int, ...] | None:
        """Buckets to poll now; None means degraded (claim everything with SKIP LOCKED)."""

    def bind_claim_fence(self, fence: asyncio.Lock) -> None:
        """The worker holds `fence` while a claim statement runs; a backend that hands buckets
        over waits on it, so a bucket is given away only after the last claim on it finished."""

    async def stop(self) -> None: ...


class StaticAssignment:
    """A fixed bucket set, e.g. `DISPATCHER_BUCKETS=0-15` or worker i of N (`i, i+N, i+2N, ...`)."""

    def __init__(self, buckets: tuple[int, ...]) -> None:
        bad = [b for b in buckets if not 0 <= b < NUM_BUCKETS]
        if bad:
            raise ValueError(f"buckets out of range 0..{NUM_BUCKETS - 1}: {bad}")
        self._buckets = tuple(sorted(set(buckets)))
        self.changed = asyncio.Event()

    async def start(self) -> None:
        self.changed.set()

    def owned(self) -> tuple[int, ...]:
        return self._buckets

    def bind_claim_fence(self, fence: asyncio.Lock) -> None:
        return None  # a static assignment never hands anything over

    async def stop(self) -> None:
        return None
