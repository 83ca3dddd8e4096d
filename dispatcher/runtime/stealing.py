"""When a partitioned worker with spare slots takes jobs from other workers' buckets, and where.

On a poll-timer wake-up or after a steal that found work, never on another bucket's NOTIFY alone;
idle steals back off; steal sizes double while steals come back full. A steal statement visits at
most MAX_VICTIMS buckets (those that gave jobs last time first) and takes only from the tail of a
bucket deeper than its owner's claim (claim_select_steal). The measurements behind each rule:
docs/design/claims.md.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection

from dispatcher.constants import NUM_BUCKETS

MAX_SKIPPED_WAKEUPS = 8  # with the default 1 s poll, an idle worker looks elsewhere every ~8 s
# a steal statement's budget: buckets visited, each read for at most reserve + batch entries
MAX_VICTIMS = 16
# How long a thief leaves shallow buckets to their owners: its steals keep each bucket's reserve
# until it has found nothing for this long; then the owners are busy, slow or gone.
RESERVE_PATIENCE_S = 1.0


class StealPolicy:
    def __init__(
        self,
        base_batch: int,
        max_batch: int,
        reserve: int = 0,
        *,
        patience_s: float = RESERVE_PATIENCE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reserve = reserve
        self._patience_s = patience_s
        self._clock = clock
        # when steals began to find nothing (None: they find jobs)
        self._dry_since: float | None = None
        self._base_batch = base_batch
        self._max_batch = max(base_batch, max_batch)
        self._batch = base_batch
        self._productive = False
        self._fresh_work_elsewhere = True  # start-up: a backlog may be waiting already
        self._backoff = 0  # timer wake-ups to skip after the next empty steal
        self._skip = 0  # timer wake-ups still to skip
        self._rich: list[int] = []  # buckets the last steal took jobs from: a hot bucket stays hot

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

    def note_own_backlog(self) -> None:
        """Our own claim came back full: a later dry spell starts from scratch."""
        self._dry_since = None

    def reserve(self) -> int:
        """Due jobs the next steal leaves at the head of each bucket: the owner's next claim, or
        none once steals have found nothing for `patience_s` (the owners are not taking them)."""
        if self._dry_since is not None and self._clock() - self._dry_since >= self._patience_s:
            return 0
        return self._reserve

    def batch(self, free: int) -> int:
        """How many jobs the next steal asks for, given the free slots."""
        return min(free, self._batch)

    def record(self, stolen: int, asked: int, from_buckets: Collection[int] = ()) -> None:
        """The outcome of a steal that was attempted, and the buckets its jobs came from."""
        self._rich = list(dict.fromkeys(from_buckets))
        full = stolen >= asked
        self._batch = min(self._max_batch, 2 * self._batch) if full else self._base_batch
        self._productive = stolen > 0
        self._fresh_work_elsewhere = False
        if stolen:
            self._backoff = self._skip = 0
            self._dry_since = None
        else:
            if self._dry_since is None:
                self._dry_since = self._clock()
            self._backoff = min(MAX_SKIPPED_WAKEUPS, max(1, 2 * self._backoff))
            self._skip = self._backoff

    def sweep(self, own: Collection[int]) -> list[list[int]]:
        """The buckets a steal may visit, in statements of at most MAX_VICTIMS buckets each: first
        those the last steal took jobs from (still not ours), then every other bucket in random
        order, so that stealers spread out instead of all piling onto the same bucket first. The
        steal goes through them until one statement finds jobs."""
        owned = set(own)
        rich = [b for b in self._rich if b not in owned]
        taken = owned.union(rich)
        others = [b for b in range(NUM_BUCKETS) if b not in taken]
        random.shuffle(others)
        order = rich + others
        return [order[i : i + MAX_VICTIMS] for i in range(0, len(order), MAX_VICTIMS)]
