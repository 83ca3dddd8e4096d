"""When a partitioned worker with spare slots looks for jobs in other workers' buckets.

Stealing keeps a hot bucket or a skewed burst from leaving workers idle while jobs wait, but a
steal walks up to 63 other buckets' index ranges, so it must not run on every idle poll:

- Never on a NOTIFY for someone else's bucket by itself: its owner gets the same notification,
  and answering it from every worker would be the stampede partitioning avoids.
- On a poll-timer wake-up, or right after a steal that found work (the backlog is still there).
- Idle back-off: each steal that finds nothing doubles the number of timer wake-ups skipped
  before the next one (1, 2, 4, then every 8th). Without it, while a 200k-job COPY was still
  uncommitted, every timer wake-up of every worker stole across 60+ buckets and walked every
  index entry the load had inserted there so far (visible to the index, not yet to the heap).
  `python -m bench scaling --modes partitioned --workers 4,8,16` (0.1 s polling), back to back:
  claim-index entries read per job 21 / 55 / 157 without the back-off, 12 / 18 / 45 with it.
- A NOTIFY for another worker's bucket (or a bulk one, for any bucket) ends the back-off: there
  is fresh work somewhere, so the next timer wake-up steals. A bulk load's NOTIFY arrives only
  at its commit, so nothing ends the back-off while the load's rows are still invisible.
- Size: a steal asks for `steal_batch` jobs; while steals come back full (a deep backlog
  elsewhere, i.e. skew) each next one asks for twice as many, up to `batch_size`; a short one
  resets it. With fixed 100-job steals, a stealer with 500 free slots ran a claim of its own
  empty buckets plus a steal walking ~30 emptied buckets per 100 jobs. A skewed drain (80% of
  200k jobs in 2 buckets, 4 workers of 500 slots, `python -m bench skew`) took 4.5-5.7 s against
  3.8-4.1 s for SKIP LOCKED; growing steals took 3.4-3.5 s against 3.4-4.1 s in the same runs.
  The sparse tail of an even drain gives short steals, which stay small: 16 workers drained
  as fast as before (58.9k vs 48.6k jobs/s, 35 vs 37 index reads per job, back to back).
"""

from __future__ import annotations

import random
from collections.abc import Collection

from dispatcher.constants import NUM_BUCKETS

MAX_SKIPPED_WAKEUPS = 8  # with the default 1 s poll, an idle worker looks elsewhere every ~8 s


class StealPolicy:
    def __init__(self, base_batch: int, max_batch: int) -> None:
        self._base_batch = base_batch
        self._max_batch = max(base_batch, max_batch)
        self._batch = base_batch
        self._productive = False
        self._fresh_work_elsewhere = True  # start-up: a backlog may be waiting already
        self._backoff = 0  # timer wake-ups to skip after the next empty steal
        self._skip = 0  # timer wake-ups still to skip

    def note_foreign_notify(self) -> None:
        """A NOTIFY for a bucket this worker does not own, or for any bucket."""
        self._fresh_work_elsewhere = True
        self._backoff = self._skip = 0

    def due(self, woke_by_timer: bool) -> bool:
        """Whether this claim cycle may steal (called once per cycle)."""
        if self._productive:
            return True
        if not woke_by_timer:
            return False
        if self._fresh_work_elsewhere:
            return True
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def batch(self, free: int) -> int:
        """How many jobs the next steal asks for, given the free slots."""
        return min(free, self._batch)

    def record(self, stolen: int, asked: int) -> None:
        """The outcome of a steal that was attempted."""
        full = stolen >= asked
        self._batch = min(self._max_batch, 2 * self._batch) if full else self._base_batch
        self._productive = stolen > 0
        self._fresh_work_elsewhere = False
        if stolen:
            self._backoff = self._skip = 0
        else:
            self._backoff = min(MAX_SKIPPED_WAKEUPS, max(1, 2 * self._backoff))
            self._skip = self._backoff

    @staticmethod
    def victims(own: Collection[int]) -> list[int]:
        """Every other bucket, from a random starting point: stealers spread out instead of all
        piling onto the same bucket first."""
        others = [b for b in range(NUM_BUCKETS) if b not in own]
        start = random.randrange(len(others))
        return others[start:] + others[:start]
