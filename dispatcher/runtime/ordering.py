"""The ordering-key sweeper: promotes the next job of keys left with waiting jobs and no holder.

The statement that ends a key's holder promotes the key's next job itself (sql/ordering.sql), so
this only catches what that statement could not see: a keyed job whose enqueue committed just
after its key's holder finished, a waiting job an operator cancelled as it was being promoted,
or a holder ended by a worker of an older release. One pod at a time (the `ordering` maintenance
lease, as the pruner's), every second or so, in pages of keys, so such a key waits about a second.
"""

from __future__ import annotations

import logging

from dispatcher.backoff import jittered
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreConflict
from dispatcher.observe import metrics

log = logging.getLogger(__name__)


class KeySweeper(PeriodicService):
    name = "ordering_sweep"
    INTERVAL_S = 1.0
    PAGE_KEYS = 1000  # keys per statement: ~1-3 ms of index descents
    ROUND_PAGES = 4  # pages per round; a longer scan goes on next round, where it stopped
    LEASE_NAME = "ordering"
    LEASE_INTERVALS = 5

    def __init__(
        self, store: JobStore, queues: tuple[str, ...], *, interval_s: float = INTERVAL_S
    ) -> None:
        super().__init__(store, interval_s)
        self._queues = queues
        self._after = dict.fromkeys(queues, "")  # where each queue's scan goes on
        self.holding = False
        self.promoted = 0

    async def tick(self) -> float | None:
        self.holding = await self._store.maintenance_lease_take(
            self.LEASE_NAME, self.LEASE_INTERVALS * self.interval_s
        )
        if not self.holding:
            return None
        pages = 0
        for queue in self._queues:
            while pages < self.ROUND_PAGES:
                pages += 1
                try:
                    scan = await self._store.ordering_promote_scan(
                        queue, self._after[queue], self.PAGE_KEYS
                    )
                except StoreConflict as exc:  # a promotion of the same key raced ours: next round
                    log.debug("ordering sweep of %s: %s", queue, exc)
                    break
                if scan.promoted:
                    self.promoted += scan.promoted
                    metrics.ORDERING_KEYS_PROMOTED.inc(scan.promoted)
                    log.info(
                        "promoted the next job of %d ordering keys of queue %s that had waiting "
                        "jobs and no holder",
                        scan.promoted,
                        queue,
                    )
                self._after[queue] = scan.last_key or ""
                if scan.last_key is None:
                    break
        return jittered(self.interval_s)

    async def release(self) -> None:
        """Give the lease up (shutdown): another pod sweeps at its next round."""
        if self.holding:
            self.holding = False
            await self._store.maintenance_lease_release(self.LEASE_NAME)
