"""The dependency sweeper: releases the children of parents that ended and whose release never ran.

The store releases a parent's children right after the statement that ended it (db/dependencies.py),
so this only catches what that could not: a worker killed between the two, or a child whose enqueue
committed while its parent was ending. One pod at a time (the `dependencies` maintenance lease, as
the key sweeper's), every second or so, so such a child waits about a second, never for ever.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from dispatcher.backoff import jittered
from dispatcher.db import rows
from dispatcher.db.dependencies import release_async
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.queries import query
from dispatcher.db.store import SLOW_STATEMENT, JobStore
from dispatcher.observe import metrics

log = logging.getLogger(__name__)


class DepSweeper(PeriodicService):
    name = "dependency_sweep"
    INTERVAL_S = 1.0
    PAGE_PARENTS = 1000  # parents per round; more go on next round
    LEASE_NAME = "dependencies"
    LEASE_INTERVALS = 5

    def __init__(self, store: JobStore, *, interval_s: float = INTERVAL_S) -> None:
        super().__init__(store, interval_s)
        self.holding = False
        self.released = 0  # parents released (for tests and the log)

    async def tick(self) -> float | None:
        self.holding = await self._store.maintenance_lease_take(
            self.LEASE_NAME, self.LEASE_INTERVALS * self.interval_s
        )
        if not self.holding:
            return None

        async def work(conn: psycopg.AsyncConnection[Any]) -> tuple[list[int], int]:
            cur = await conn.execute(query("deps_stranded"), {"limit": self.PAGE_PARENTS})
            parents: list[int] = rows.values(await cur.fetchall())
            return parents, (await release_async(conn, parents) if parents else 0)

        parents, queued = await self._store.run("deps_sweep", work, budget=SLOW_STATEMENT)
        if parents:
            self.released += len(parents)
            metrics.DEPENDENCIES_SWEPT.inc(len(parents))
            log.info(
                "released the children of %d parents that had ended (%d children queued)",
                len(parents),
                queued,
            )
        return jittered(self.interval_s)

    async def release(self) -> None:
        """Give the lease up (shutdown): another pod sweeps at its next round."""
        if self.holding:
            self.holding = False
            await self._store.maintenance_lease_release(self.LEASE_NAME)
