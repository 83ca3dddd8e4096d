"""Claim windows: during a backlog, a partitioned claim reads a few of the owned buckets, not all.

A partitioned claim merges one ordered index walk per bucket it reads (Merge Append), and each
walk costs a descent of the bucket index to start: on 200k queued jobs a claim's selection took
0.30 ms over 8 buckets, 0.43-0.49 ms over 16 and 0.87-1.0 ms over 32, against 0.16-0.25 ms for
SKIP LOCKED's single walk (limit 25, the claim size a backlog gives at the default concurrency
100: a claim waits for a quarter of the slots to be free). With 2 workers, each owning 32 buckets, that made
partitioned's steady drain half as fast as SKIP LOCKED's at the defaults (17k vs 32k jobs/s).

So while a backlog lasts, each claim reads one window of at most WINDOW_BUCKETS of our buckets
(strided: own[i::n], so windows are even and fixed for an assignment) and the next claim the next
window. A window that comes back short (its buckets ran low) passes to the next one; when every
window in a row came back short, the next claim reads all our buckets at once, without sleeping
first, and that claim decides as any other: full, the backlog goes on; short, the worker may
steal, then sleeps (as every claim out of a backlog reads all buckets: a wake-up for one job must
find it wherever it is).

Order: within a claim, (priority, run_at, id) as always; across our buckets, a job of high
priority waits at most n - 1 claims of a backlog for its window (3 claims, a few ms, at 32 buckets).
"""

from __future__ import annotations

WINDOW_BUCKETS = 8  # 8 walks cost about what SKIP LOCKED's one walk costs (figures above)


class ClaimWindows:
    def __init__(self, size: int = WINDOW_BUCKETS) -> None:
        self._size = size
        self._next: dict[str, int] = {}  # queue -> the window the next claim reads
        self._short: dict[str, int] = {}  # queue -> windows in a row that came back short
        self._count: dict[str, int] = {}  # queue -> windows of the assignment last seen
        self._round_over: set[str] = set()  # queues whose next claim reads all their buckets

    def pick(self, queue: str, own: tuple[int, ...] | None) -> tuple[tuple[int, ...] | None, bool]:
        """The buckets of this claim, and whether they are a window (a part of `own`)."""
        if own is None or len(own) <= self._size:
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
