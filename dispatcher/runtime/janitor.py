"""The janitor: retention. `Pruner`, the service, deletes rows past their retention, one pod at a
time, in bounded batches, every prune_interval_s; `prune_round` is its round: one transaction
behind a try-lock, a bounded DELETE per kind (PRUNE_QUERIES), ended uniqueness windows, the lag.
Under DISPATCHER_COMPLETED_JOBS=archive the completed kind moves rows to the archive instead
(ARCHIVE_QUERIES), and the archive's partitions are kept up after the round (runtime/archive.py).
What each setting leaves to prune: docs/operations/retention.md.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.backoff import jittered
from dispatcher.constants import NUM_BUCKETS
from dispatcher.db import rows
from dispatcher.db.completions import archived
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.queries import query
from dispatcher.db.store import SLOW_STATEMENT, JobStore
from dispatcher.errors import StoreError
from dispatcher.observe import metrics
from dispatcher.runtime import archive
from dispatcher.settings.sections import RetentionSettings

log = logging.getLogger(__name__)

# What the pruner deletes, by kind (the label of dispatcher_jobs_pruned_total): its named query.
PRUNE_QUERIES = {
    "completed": "jobs_prune_completed",
    "failed": "jobs_prune_unsuccessful",
    "history": "history_prune",
}
# Under DISPATCHER_COMPLETED_JOBS=archive: completed rows still in the jobs table move to the
# archive.
ARCHIVE_QUERIES = {**PRUNE_QUERIES, "completed": "jobs_archive_completed"}
# The pin of a job kind's DELETE to one bucket on a Citus cluster ({and_bucket} in its text).
_BY_BUCKET = "AND bucket = %(bucket)s::smallint"


@dataclass(frozen=True, slots=True)
class PruneRound:
    """One pruning round of this pod: rows deleted by kind, whether some kind had more past its
    retention than the round's statements took, and the age of the oldest row of each kind left
    (seconds; None: no such row), from which the janitor's lag is computed."""

    deleted: dict[str, int]
    more: bool
    oldest_age_s: dict[str, float | None]


async def prune_round(
    store: JobStore,
    retentions_s: Mapping[str, float],
    limit: int,
    max_statements: int,
    queries: Mapping[str, str] = PRUNE_QUERIES,
) -> PruneRound | None:
    """One round: None if another pod holds the pruner's lock (it is pruning now; never waited
    for). Else deletes of at most `limit` rows of each kind past its retention (kinds of
    PRUNE_QUERIES; absent: kept forever), again for kinds whose batch came back full while fewer
    than `max_statements` ran, then the oldest ages."""

    async def work(conn: psycopg.AsyncConnection[Any]) -> PruneRound | None:
        async with conn.transaction():
            cur = await conn.execute(query("prune_try_lock"))
            if not rows.value(await cur.fetchone()):
                return None
            # On a Citus cluster each job kind's DELETE goes bucket by bucket (_BY_BUCKET).
            by_bucket = store.sharded is not None
            deleted = dict.fromkeys(retentions_s, 0)
            pending, statements = list(retentions_s), 0
            while pending and statements < max_statements:
                for kind in list(pending):
                    params = {"retention_s": retentions_s[kind], "limit": limit}
                    n = await _delete(conn, queries[kind], kind, params, by_bucket)
                    deleted[kind] += n
                    statements += 1
                    if n < limit:
                        pending.remove(kind)
                    if statements >= max_statements:
                        break
            while statements < max_statements:  # windows: pages until one comes back short
                cur = await conn.execute(query("dedupe_windows_prune"), {"limit": limit})
                statements += 1
                if rows.value(await cur.fetchone()) < limit:
                    break
            cur = await conn.execute(query("janitor_ages"))
            ages = rows.typed_one(rows.PruneAges, await cur.fetchone()) or rows.PruneAges(
                None, None, None
            )
        return PruneRound(deleted, bool(pending), ages._asdict())

    # The round's statements share one budget: each takes milliseconds (EXPLAINs in
    # dispatcher/db/sql/maintenance.sql).
    return await store.run("prune", work, budget=SLOW_STATEMENT)


async def _delete(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    kind: str,
    params: dict[str, Any],
    by_bucket: bool,
) -> int:
    """Up to params["limit"] rows of `kind` past its retention deleted; how many. `by_bucket`:
    the jobs table is distributed, so a job kind's DELETE is sent to one bucket at a time (a
    router query: Citus refuses FOR UPDATE over several shards), from a random bucket on, until
    the limit is reached or every bucket was visited."""
    sql = query(name).replace("{archive_gone}", archived("gone"))
    if kind == "history" or not by_bucket:
        cur = await conn.execute(sql.replace("{and_bucket}", ""), params)
        # The job kinds return their count (a CTE closes windows), history its rowcount.
        return int(rows.value(await cur.fetchone())) if cur.description else cur.rowcount
    sql = sql.replace("{and_bucket}", _BY_BUCKET)
    limit, n, first = params["limit"], 0, random.randrange(NUM_BUCKETS)
    for i in range(NUM_BUCKETS):
        bucket = (first + i) % NUM_BUCKETS
        cur = await conn.execute(sql, {**params, "limit": limit - n, "bucket": bucket})
        n += int(rows.value(await cur.fetchone()))
        if n >= limit:
            break
    return n


class Pruner(PeriodicService):
    """Deletes rows past their retention, by kind (PRUNE_QUERIES: completed jobs, failed ones,
    history rows; a kind whose retention is 0 is kept forever).

    One pod at a time: the pod holding the `janitor` maintenance lease (migration 0006, on the
    database's clock, LEASE_INTERVALS intervals long, renewed each round, given up at shutdown)
    prunes and exports the lag; the others skip their rounds and export no lag, so N pods do not
    export N copies. A round is also one transaction behind a try-lock: a pod whose lease ran out
    mid-round never prunes beside the next holder. In bounded batches:
    each DELETE takes at most `batch` rows (~2 ms per 1,000 at 500k rows), a round at most
    ROUND_STATEMENTS of them; while some kind has more waiting, the next round comes about
    CATCH_UP_S later instead of an interval later, so a backlog drains (up to ~12,000 rows a
    second at the default batch) without a long statement or transaction, and other pods get
    their turn in between."""

    name = "prune"
    ROUND_STATEMENTS = 6
    CATCH_UP_S = 0.5
    LEASE_NAME = "janitor"
    LEASE_INTERVALS = 3  # a holder may miss two rounds (a slow statement, a blip) and keep the role

    def __init__(self, store: JobStore, settings: RetentionSettings) -> None:
        # First prune after a random fraction of the interval, so N pods started together spread
        # out; under archive within 5 s, so that the archive's partitions exist before
        # many completions find none and go to its default partition.
        first_s = settings.interval_s if not settings.archive else min(settings.interval_s, 5.0)
        super().__init__(store, settings.interval_s, first_delay_s=first_s * random.random())
        self._retentions_s = {kind: r for kind, r in settings.retentions_s.items() if r > 0}
        self._batch = settings.batch
        # Under archive, completed rows in the jobs table move at any age (retention 0 here), and
        # the completed retention is the archive's, kept by dropping partitions.
        self._archive_retention_s: float | None = None
        if settings.archive:
            self._archive_retention_s = settings.retentions_s.get("completed", 0.0)
            self._retentions_s["completed"] = 0.0
        self.last_upkeep: archive.Upkeep | None = None
        self.rounds = 0  # rounds this pod ran (it held the lock)
        self.skipped = 0  # rounds skipped: another pod held the lock
        self.last_round: PruneRound | None = None
        self.holding = False  # this pod holds the janitor lease (as of its last round)
        for kind in PRUNE_QUERIES:
            metrics.JOBS_PRUNED.labels(kind)  # every kind's series exists from the start (0)

    async def tick(self) -> float | None:
        if not self._retentions_s:
            self.retired = True  # every kind is kept forever
            return None
        try:
            self.holding = await self._store.maintenance_lease_take(
                self.LEASE_NAME, self.LEASE_INTERVALS * self.interval_s
            )
            done = (
                None
                if not self.holding
                else await prune_round(
                    self._store,
                    self._retentions_s,
                    self._batch,
                    self.ROUND_STATEMENTS,
                    PRUNE_QUERIES if self._archive_retention_s is None else ARCHIVE_QUERIES,
                )
            )
            if done is not None and self._archive_retention_s is not None:
                self.last_upkeep = await archive.upkeep(
                    self._store, self._archive_retention_s, self.interval_s, self._batch
                )
        except StoreError:
            metrics.JANITOR_LAG.clear()  # no fresh figure from this pod
            raise
        if done is None:
            self.skipped += 1
            metrics.JANITOR_LAG.clear()  # the pod pruning now exports it
            return None
        self.rounds += 1
        self.last_round = done
        for kind, n in done.deleted.items():
            metrics.JOBS_PRUNED.labels(kind).inc(n)
        for kind, retention_s in self._retentions_s.items():
            age_s = done.oldest_age_s[kind]
            metrics.JANITOR_LAG.labels(kind).set(
                0.0 if age_s is None else max(0.0, age_s - retention_s)
            )
        if self.last_upkeep is not None and self._archive_retention_s:
            metrics.JANITOR_LAG.labels("archive").set(
                self.last_upkeep.lag_s(self._archive_retention_s)
            )
        return jittered(self.CATCH_UP_S) if done.more else None

    async def cover_the_clock(self) -> None:
        """Under archive, before this worker's first claim: partitions from now on, created at
        once, so that its first completions never land in the default partition (the janitor's
        first round comes up to 5 s later; the migration's partition covers a quarter hour).
        Never fatal: the janitor's rounds try again."""
        if self._archive_retention_s is None:
            return
        try:
            await archive.upkeep(
                self._store, self._archive_retention_s, self.interval_s, 0, drop=False
            )
        except StoreError as exc:
            log.warning("archive partitions not created before the first claim: %s", exc)

    async def release(self) -> None:
        """Give the janitor lease up (shutdown): another pod prunes at its next round."""
        if self.holding:
            self.holding = False
            await self._store.maintenance_lease_release(self.LEASE_NAME)
