"""Claim windows: during a backlog, a partitioned claim reads a few of the owned buckets, not all.

A partitioned claim merges one ordered index walk per bucket it reads (Merge Append), and each
walk costs a descent of the bucket index to start: on 200k queued jobs a claim's selection took
0.30 ms over 8 buckets, 0.43-0.49 ms over 16 and 0.87-1.0 ms over 32, against 0.16-0.25 ms for
SKIP LOCKED's single walk (limit 25, the claim size a backlog gives at the default concurrency
100: a claim waits for a quarter of the slots to be free). With 2 workers, each owning 32 buckets, that made
partitioned's steady drain half as fast as SKIP LOCKED's at the defaults (17k vs 32k jobs/s).

So while a backlog lasts, each claim reads one window of our buckets (strided: own[i::n], so
windows are even and fixed for an assignment) and the next claim the next window. A window that
comes back short (its buckets ran low) passes to the next one; when every window in a row came
back short, the next claim reads all our buckets at once, without sleeping first, and that claim
decides as any other: full, the backlog goes on; short, the worker may steal, then sleeps (as
every claim out of a backlog reads all buckets: a wake-up for one job must find it wherever it
is).

How many buckets a window holds follows the claim size of a backlog (a quarter of the slots):
about JOBS_PER_WALK jobs per bucket walk, at least MIN_WINDOW_BUCKETS and at most
MAX_WINDOW_BUCKETS. From the figures above, a walk's descent costs what reading 2-4 jobs does, so
at 16 jobs a walk the descents are a fifth of the claim or less. At the defaults (claims of ~25)
that is 2 buckets: `python -m bench coldstart` at 2 and 4 workers (3-4 interleaved rounds)
drained 1.045x and 1.06x as fast as SKIP LOCKED with windows of 2, 0.98x and 0.98x with windows
of 8, and the server's CPU per job dropped from 16.0-16.9 to 14.6-15.3 us. At the bench's
settings (claims of 125 or more) windows of 8 were as fast or faster (1.00x and 1.02x, against
0.99x with 2), and the size stays 8. A ready fleet of 2 draining 200k at the defaults (4 rounds):
1.06x with windows of 2, 0.925x with 8; 50k, the demo's size (5 rounds): 0.94x and 0.96x, within
the noise of a 0.7 s drain.

Order: within a claim, (priority, run_at, id) as always; across our buckets, a job of high
priority waits at most n - 1 claims of a backlog for its window (15 claims of ~2 ms at 32 buckets
in windows of 2).
"""

from __future__ import annotations

JOBS_PER_WALK = 16
MIN_WINDOW_BUCKETS = 2
MAX_WINDOW_BUCKETS = 8  # 8 walks take 0.30 ms, SKIP LOCKED's one walk 0.16-0.25 ms (figures above)


def window_buckets(claim_size: int) -> int:
    """The buckets a window holds for claims of `claim_size` jobs (module docstring)."""
    if claim_size < 1:
        raise ValueError(f"a claim takes at least 1 job, got {claim_size}")
    return min(MAX_WINDOW_BUCKETS, max(MIN_WINDOW_BUCKETS, -(-claim_size // JOBS_PER_WALK)))


class ClaimWindows:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a window holds at least 1 bucket, got {size}")
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
