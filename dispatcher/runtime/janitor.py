"""The janitor's round: deletes rows past their retention, one pod at a time, in bounded batches
(maintenance.Pruner runs it every prune_interval_s).

One transaction: a try-lock (pg_try_advisory_xact_lock, so it works through PgBouncer), DELETEs
of at most prune_batch rows of each kind (completed; failed, discarded, cancelled; history), oldest
first through the migration-0007 indexes, then uniqueness windows that ended (sql/dedupe.sql), in
pages of prune_batch, then the lag. Live jobs are never touched.
Under DISPATCHER_COMPLETED_JOBS=delete the completion itself deletes a completed job's row: the
completed kind's DELETE then finds nothing (one index descent) once the rows completed before that
was set are gone, and its lag reads 0; it is kept so that those rows still go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.db import rows
from dispatcher.db.queries import query
from dispatcher.db.store import SLOW_STATEMENT, JobStore

# What the pruner deletes, by kind (the label of dispatcher_jobs_pruned_total): its named query.
PRUNE_QUERIES = {
    "completed": "jobs_prune_completed",
    "failed": "jobs_prune_unsuccessful",
    "history": "history_prune",
}


@dataclass(frozen=True, slots=True)
class PruneRound:
    """One pruning round of this pod: rows deleted by kind, whether some kind had more past its
    retention than the round's statements took, and the age of the oldest row of each kind left
    (seconds; None: no such row), from which the janitor's lag is computed."""

    deleted: dict[str, int]
    more: bool
    oldest_age_s: dict[str, float | None]


async def prune_round(
    store: JobStore, retentions_s: Mapping[str, float], limit: int, max_statements: int
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
            deleted = dict.fromkeys(retentions_s, 0)
            pending, statements = list(retentions_s), 0
            while pending and statements < max_statements:
                for kind in list(pending):
                    params = {"retention_s": retentions_s[kind], "limit": limit}
                    cur = await conn.execute(query(PRUNE_QUERIES[kind]), params)
                    # The job kinds return their count (a CTE closes windows), history its rowcount.
                    n = int(rows.value(await cur.fetchone())) if cur.description else cur.rowcount
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
