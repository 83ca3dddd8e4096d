"""Claim windows: during a backlog, a partitioned claim reads a few of the owned buckets, not
all.

Each claim reads the next window (strided: own[i::n]); when every window came back short, the
next claim reads all buckets again. The window holds about JOBS_PER_WALK jobs per bucket walk,
between MIN_WINDOW_BUCKETS and MAX_WINDOW_BUCKETS. A worker that owns every bucket reads them all
in one index walk and needs no window. A window's claim is vetoed where another owned bucket
holds a due job of better priority (sql/claim.sql, claim_window): then the claims of the queue
read all its buckets until its backlog ends. Why, with the measurements: docs/design/claims.md.
"""

from __future__ import annotations

from dispatcher.constants import NUM_BUCKETS

JOBS_PER_WALK = 16
MIN_WINDOW_BUCKETS = 2
# 8 walks take 0.30 ms, SKIP LOCKED's one walk 0.16-0.25 ms (docs/design/claims.md)
MAX_WINDOW_BUCKETS = 8


def window_buckets(claim_size: int) -> int:
    """The buckets a window holds for claims of `claim_size` jobs (module docstring)."""
    if claim_size < 1:
        raise ValueError(f"a claim takes at least 1 job, got {claim_size}")
    return min(MAX_WINDOW_BUCKETS, max(MIN_WINDOW_BUCKETS, -(-claim_size // JOBS_PER_WALK)))


def beyond_window(own: tuple[int, ...], window: tuple[int, ...]) -> tuple[int, ...]:
    """The owned buckets a window leaves out: where its veto looks."""
    inside = set(window)
    return tuple(b for b in own if b not in inside)


class ClaimWindows:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a window holds at least 1 bucket, got {size}")
        self._size = size
        self._next: dict[str, int] = {}  # queue -> the window the next claim reads
        self._short: dict[str, int] = {}  # queue -> windows in a row that came back short
        self._count: dict[str, int] = {}  # queue -> windows of the assignment last seen
        self._round_over: set[str] = set()  # queues whose next claim reads all their buckets
        self._outranked: set[str] = (
            set()
        )  # queues whose claims read all buckets until the backlog ends

    def pick(self, queue: str, own: tuple[int, ...] | None) -> tuple[tuple[int, ...] | None, bool]:
        """The buckets of this claim, and whether they are a window (a part of `own`)."""
        if own is None or len(own) <= self._size or len(own) >= NUM_BUCKETS:
            return own, False
        if queue in self._outranked:
            return own, False
        if queue in self._round_over:
            self._round_over.discard(queue)
            return own, False
        count = -(-len(own) // self._size)
        if self._count.get(queue) != count:
            self._count[queue], self._short[queue] = count, 0
        index = self._next.get(queue, 0) % count
        self._next[queue] = index + 1
        return own[index::count], True

    def record(self, queue: str, full: bool) -> None:
        """After a windowed claim: a whole round of short windows makes the next claim read all
        the buckets (and that claim decides whether the backlog goes on)."""
        self._short[queue] = 0 if full else self._short.get(queue, 0) + 1
        if self._short[queue] >= self._count.get(queue, 1):
            self._short[queue] = 0
            self._round_over.add(queue)

    def outranked(self, queue: str) -> None:
        """A window's claim was vetoed: the priorities of the backlog differ across our buckets,
        so the queue's claims read all of them until its backlog ends (`ended`)."""
        self._outranked.add(queue)

    def ended(self, queue: str) -> None:
        """A claim of all the queue's buckets came back short: its backlog is over, and the next
        one starts with windows again."""
        self._outranked.discard(queue)
