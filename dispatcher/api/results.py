"""Awaiting a job's end: `JobHandle`, the id enqueue returns, whose `result()` waits for the job.

The wait marks the job awaited (job_result_watch), so the statement that ends it sends a NOTIFY on
RESULTS_CHANNEL ('<id>:<status>'), and listens for it on its connection; it reads the job again
at each notification and every `poll_s` whatever happens (a notification lost with a dropped
connection costs a poll, never the wait). A job the jobs table no longer holds is read in the
archive (DISPATCHER_COMPLETED_JOBS=archive moves it there as it completes). A completed job gives
its handler's return value (None if it returned nothing, or its row is gone: deleted by its
completion under DISPATCHER_COMPLETED_JOBS=delete); one that ended failed, discarded or cancelled
raises JobFailed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from dispatcher.db import rows
from dispatcher.db.port import InProcessStore
from dispatcher.db.queries import query
from dispatcher.db.rows import JobEnd
from dispatcher.db.translate import translate_errors
from dispatcher.errors import DispatcherError, JobFailed, JobNotFound
from dispatcher.model import STATUS_CANCELLED, STATUS_COMPLETED, STATUS_DISCARDED, STATUS_FAILED

AsyncSource = psycopg.AsyncConnection[Any] | psycopg_pool.AsyncConnectionPool | InProcessStore
SyncSource = psycopg.Connection[Any] | psycopg_pool.ConnectionPool | InProcessStore
# How often a wait reads the job whatever the notifications say.
POLL_S = 1.0
_ENDED_BADLY = (STATUS_FAILED, STATUS_DISCARDED, STATUS_CANCELLED)


class JobHandle(int):
    """A job's id (an int: whatever takes an id takes it) that can wait for the job's end.

    `await handle.result(timeout=30)` (or `handle.result_sync(...)`) waits on the pool or
    connection the job was enqueued with, or on `using`. A connection must not be inside a
    transaction (commit the enqueue's first: until then no worker can see the job)."""

    _source: Any

    def __new__(cls, job_id: int, source: Any = None) -> JobHandle:
        handle = super().__new__(cls, job_id)
        handle._source = source
        return handle

    async def result(
        self, timeout: float | None = None, *, using: AsyncSource | None = None
    ) -> Any:
        """The job's result once it completed; JobFailed if it ended otherwise, TimeoutError after
        `timeout` seconds (None: no limit), JobNotFound if there is no such job."""
        source = using if using is not None else self._source
        deadline = None if timeout is None else time.monotonic() + timeout
        if isinstance(source, InProcessStore):
            return await _in_process_async(source, int(self), deadline)
        if isinstance(source, psycopg_pool.AsyncConnectionPool):
            async with source.connection() as conn:
                return await _wait_async(conn, int(self), deadline)
        if isinstance(source, psycopg.AsyncConnection):
            return await _wait_async(source, int(self), deadline)
        raise DispatcherError(
            "result() needs an async connection or pool: pass using=..., or call result_sync"
        )

    def result_sync(self, timeout: float | None = None, *, using: SyncSource | None = None) -> Any:
        """result(), for sync code."""
        source = using if using is not None else self._source
        deadline = None if timeout is None else time.monotonic() + timeout
        if isinstance(source, InProcessStore):
            return _in_process_sync(source, int(self), deadline)
        if isinstance(source, psycopg_pool.ConnectionPool):
            with source.connection() as conn:
                return _wait_sync(conn, int(self), deadline)
        if isinstance(source, psycopg.Connection):
            return _wait_sync(source, int(self), deadline)
        raise DispatcherError(
            "result_sync() needs a sync connection or pool: pass using=..., or await result()"
        )


def handle(job_id: int | None, source: Any) -> JobHandle | None:
    """enqueue's answer: the new job's handle, or None (a dedupe key held)."""
    return None if job_id is None else JobHandle(job_id, source)


def outcome(job_id: int, end: JobEnd | None, seen: bool) -> tuple[bool, Any]:
    """(ended, its result) from the job's row now (None: gone); raises if it ended badly, or was
    never there."""
    if end is None:
        if not seen:
            raise JobNotFound(f"job {job_id} does not exist")
        return True, None  # deleted by its completion (DISPATCHER_COMPLETED_JOBS=delete)
    if end.status == STATUS_COMPLETED:
        return True, end.result
    if end.status in _ENDED_BADLY:
        raise JobFailed(job_id, end.status, end.last_error)
    return False, None


def _remaining(deadline: float | None, job_id: int) -> float:
    if deadline is None:
        return POLL_S
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"job {job_id} has not ended yet")
    return min(POLL_S, left)


def _idle(status: TransactionStatus, job_id: int) -> None:
    if status != TransactionStatus.IDLE:
        raise DispatcherError(
            f"waiting for job {job_id} needs a connection outside any transaction: commit first "
            "(a job enqueued in an open transaction is not visible to any worker yet)"
        )


def _for_us(payload: str, job_id: int) -> bool:
    return payload.partition(":")[0] == str(job_id)


# -- async -----------------------------------------------------------------------------------------


async def _wait_async(
    conn: psycopg.AsyncConnection[Any], job_id: int, deadline: float | None
) -> Any:
    _idle(conn.info.transaction_status, job_id)
    autocommit = conn.autocommit
    with translate_errors("result"):
        await conn.set_autocommit(True)
        try:
            await conn.execute(query("results_listen"))
            cur = await conn.execute(query("job_result_watch"), {"id": job_id})
            end = rows.typed_one(JobEnd, await cur.fetchone())
            if end is None:  # not in the jobs table: archived (maybe just now), or none
                cur = await conn.execute(query("job_result_read"), {"id": job_id})
                end = rows.typed_one(JobEnd, await cur.fetchone())
            seen = end is not None
            while True:
                ended, value = outcome(job_id, end, seen)
                if ended:
                    return value
                async for note in conn.notifies(timeout=_remaining(deadline, job_id)):
                    if _for_us(note.payload, job_id):
                        break
                cur = await conn.execute(query("job_result_read"), {"id": job_id})
                end = rows.typed_one(JobEnd, await cur.fetchone())
        finally:
            if not conn.closed:
                await conn.execute(query("results_unlisten"))
                await conn.set_autocommit(autocommit)


async def _in_process_async(store: InProcessStore, job_id: int, deadline: float | None) -> Any:
    """The in-memory store (dispatcher.testing): read until the job ended."""
    seen = False
    while True:
        end = store.job_end(job_id)
        seen = seen or end is not None
        ended, value = outcome(job_id, end, seen)
        if ended:
            return value
        await asyncio.sleep(min(0.01, _remaining(deadline, job_id)))


# -- sync ------------------------------------------------------------------------------------------


def _wait_sync(conn: psycopg.Connection[Any], job_id: int, deadline: float | None) -> Any:
    _idle(conn.info.transaction_status, job_id)
    autocommit = conn.autocommit
    with translate_errors("result"):
        conn.set_autocommit(True)
        try:
            conn.execute(query("results_listen"))
            end = rows.typed_one(
                JobEnd, conn.execute(query("job_result_watch"), {"id": job_id}).fetchone()
            )
            if end is None:  # not in the jobs table: archived (maybe just now), or none
                end = rows.typed_one(
                    JobEnd, conn.execute(query("job_result_read"), {"id": job_id}).fetchone()
                )
            seen = end is not None
            while True:
                ended, value = outcome(job_id, end, seen)
                if ended:
                    return value
                for note in conn.notifies(timeout=_remaining(deadline, job_id)):
                    if _for_us(note.payload, job_id):
                        break
                end = rows.typed_one(
                    JobEnd, conn.execute(query("job_result_read"), {"id": job_id}).fetchone()
                )
        finally:
            if not conn.closed:
                conn.execute(query("results_unlisten"))
                conn.set_autocommit(autocommit)


def _in_process_sync(store: InProcessStore, job_id: int, deadline: float | None) -> Any:
    seen = False
    while True:
        end = store.job_end(job_id)
        seen = seen or end is not None
        ended, value = outcome(job_id, end, seen)
        if ended:
            return value
        time.sleep(min(0.01, _remaining(deadline, job_id)))
