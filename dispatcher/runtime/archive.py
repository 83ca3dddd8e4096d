"""The archive's partitions (DISPATCHER_COMPLETED_JOBS=archive, migration 0020): the span of one
partition, picked from the completed jobs' retention, and the janitor's upkeep call, which creates
partitions ahead of the clock and drops those wholly past retention (docs/design/archive.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.db import rows
from dispatcher.db.queries import query
from dispatcher.db.store import SLOW_STATEMENT, JobStore
from dispatcher.observe import metrics

log = logging.getLogger(__name__)

# The spans a partition may have (the SQL function accepts these only): a minute to a day.
PERIODS_S = (60, 300, 900, 3600, 86400)
# Partitions per retention, at least: a dropped partition then holds about a quarter of it, so
# rows outlive their retention by at most a quarter more.
PARTITIONS_PER_RETENTION = 4


def period_s(retention_s: float) -> int:
    """The longest span of PERIODS_S at most retention / PARTITIONS_PER_RETENTION (a minute at
    least); a day when completed jobs are kept forever (0)."""
    if retention_s <= 0:
        return PERIODS_S[-1]
    fitting = [p for p in PERIODS_S if p <= retention_s / PARTITIONS_PER_RETENTION]
    return fitting[-1] if fitting else PERIODS_S[0]


def ahead_s(period: int, interval_s: float) -> float:
    """How far ahead of the clock partitions exist: two spans, and three janitor rounds, so a
    janitor that misses rounds (a slow statement, a new holder) never lets rows reach the
    default partition."""
    return float(min(max(2 * period, 3 * interval_s), 7 * 86400))


@dataclass(frozen=True, slots=True)
class Upkeep:
    """One upkeep call: partitions created and dropped, default-partition rows deleted, and the
    age of the oldest range partition's upper bound or default row left (None: neither), which
    is past the retention by the janitor's lag."""

    created: int
    dropped: int
    default_deleted: int
    oldest_age_s: float | None

    def lag_s(self, retention_s: float) -> float:
        """How far past `retention_s` the oldest of what is left is (0: caught up)."""
        if self.oldest_age_s is None or retention_s <= 0:
            return 0.0
        return max(0.0, self.oldest_age_s - retention_s)


async def upkeep(
    store: JobStore, retention_s: float, interval_s: float, limit: int, *, drop: bool = True
) -> Upkeep:
    """Partitions created ahead and dropped past `retention_s` (0: none dropped), in one short
    transaction of its own (its DDL waits at most 100 ms for a lock: else a store error, and the
    next round tries again). `drop=False`: partitions created only (a worker before its first
    claim; retention is the janitor's)."""
    period = period_s(retention_s)
    params = {
        "period_s": period,
        "ahead_s": ahead_s(period, interval_s),
        "retention_s": retention_s if drop else 0.0,
        "limit": limit,
    }

    async def work(conn: psycopg.AsyncConnection[Any]) -> Upkeep:
        async with conn.transaction():
            cur = await conn.execute(query("archive_maintain"), params)
            row = await cur.fetchone()
        done = rows.typed_one(rows.ArchiveUpkeep, row)
        return Upkeep(0, 0, 0, None) if done is None else Upkeep(*done)

    done = await store.run("archive", work, budget=SLOW_STATEMENT)
    if done.created or done.dropped:
        log.info(
            "archive partitions: %d created, %d dropped past retention (%.0f s)",
            done.created,
            done.dropped,
            retention_s,
        )
    metrics.ARCHIVE_PARTITIONS.labels("created").inc(done.created)
    metrics.ARCHIVE_PARTITIONS.labels("dropped").inc(done.dropped)
    return done
