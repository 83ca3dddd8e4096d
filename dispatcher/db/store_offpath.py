"""The store port's statements off the worker's path (dispatcher/db/port.py): enqueue, an operator's
cancel, a job's state, and the maintenance services' reads (database pressure, queue depths,
planner statistics). Mixed into `JobStore` (dispatcher/db/store.py), whose statement runner they
use."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg

from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db import rows
from dispatcher.db.inserts import insert_one_params, insert_one_sql
from dispatcher.db.literals import int_array
from dispatcher.db.port import NewJob
from dispatcher.db.queries import query
from dispatcher.db.rows import DbPressure, JobState, QueueDepth
from dispatcher.db.sharded import ShardedStatements
from dispatcher.errors import StoreConflict

# Budgets in multiples of ConnectionLimits.statement_timeout_s: hot statements take milliseconds;
# ANALYZE and prune batches can take seconds on a big, busy table
# (docs/design/postgres-plumbing.md).
SLOW_STATEMENT = 6.0


class OffPathStatements:
    """What JobStore provides these methods with."""

    async def _execute(
        self, what: str, sql: str, params: dict[str, Any], *, budget: float = 1.0
    ) -> psycopg.AsyncCursor[Any]:
        raise NotImplementedError

    async def _placement(self) -> ShardedStatements | None:
        raise NotImplementedError

    async def deps_release(self, parents: Sequence[int]) -> int:
        raise NotImplementedError

    async def jobs_enqueue(self, jobs: Sequence[NewJob]) -> list[int | None]:
        """One jobs_insert_one each (applications enqueue with dispatcher.enqueue, in their own
        transaction). Not with a dedupe window: dispatcher.enqueue takes its key's lock first."""
        if any(getattr(job, "dedupe_window_s", None) is not None for job in jobs):
            raise ValueError(
                "jobs_enqueue takes no dedupe_window_s: enqueue with dispatcher.enqueue"
            )
        ids: list[int | None] = []
        for job in jobs:
            cur = await self._execute("enqueue", insert_one_sql(job), insert_one_params(job))
            ids.append(rows.value(await cur.fetchone()))
        return ids

    async def jobs_cancel(self, ids: Sequence[int]) -> dict[int, str]:
        """What `dispatcher jobs cancel --id` runs (admin_jobs_cancel), with no filter."""
        sharded = await self._placement()
        if sharded is not None:
            after = await sharded.cancel(ids)
            await self.deps_release([i for i, status in after.items() if status == "cancelled"])
            return after
        sql = query("admin_jobs_cancel").replace("{filters}", "true")
        cur = await self._execute("cancel", sql, {"ids": int_array(ids)})
        written = rows.typed(rows.WrittenJob, await cur.fetchall())
        # A keyed job cancelled at once lets its key go on, as `dispatcher jobs cancel` does
        # (admin.py).
        released = rows.released_keys(written, ["cancelled"])
        if released:
            params = {
                "queues": [q for q, _ in released],
                "keys": [k for _, k in released],
                "channel": NOTIFY_CHANNEL,
            }
            # StoreConflict: another promotion of the key raced this one: it has its next job, or
            # the sweeper gives it one
            with contextlib.suppress(StoreConflict):
                await self._execute("cancel", query("ordering_promote_keys"), params)
        await self.deps_release([job.id for job in written if job.status == "cancelled"])
        return {job.id: job.status for job in written if job.status is not None}

    async def job_get(self, job_id: int) -> JobState | None:
        cur = await self._execute("show", query("admin_job_show"), {"id": job_id})
        return rows.typed_one(JobState, await cur.fetchone())

    async def db_pressure(self) -> DbPressure | None:
        cur = await self._execute("db_pressure", query("db_pressure"), {}, budget=SLOW_STATEMENT)
        return rows.typed_one(DbPressure, await cur.fetchone())

    async def queue_depth(self) -> list[QueueDepth]:
        cur = await self._execute("queue_depth", query("queue_depth"), {}, budget=SLOW_STATEMENT)
        return rows.typed(QueueDepth, await cur.fetchall())

    async def jobs_analyze_if_stale(self) -> None:
        """Refresh planner statistics if they are far behind (one pod at a time; see
        sql/maintenance.sql). StorePermissionDenied if our role may not ANALYZE the table at all."""
        await self._execute("analyze", query("jobs_analyze_if_stale"), {}, budget=SLOW_STATEMENT)

    async def jobs_autovacuum_on(self) -> bool:
        """Whether autovacuum refreshes the jobs table's statistics (sql/maintenance.sql)."""
        cur = await self._execute("analyze", query("jobs_autovacuum_on"), {})
        return bool(rows.value(await cur.fetchone()))
