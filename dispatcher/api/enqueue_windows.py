"""Enqueue with a uniqueness window (`dedupe_window_s`): the statements of sql/dedupe.sql around
the plain inserts, for one job and for a staged batch.

A windowed enqueue of a key first asks, in one statement, whether the key is held, taking the
key's advisory lock only if it looks free; then asks again in a statement of its own, whose
snapshot is taken under that lock; only then inserts the job and makes its window the key's. Why
that is race-free: docs/design/enqueue.md. A job without a window never comes here.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from typing import Any

import psycopg

from dispatcher.db import rows
from dispatcher.db.inserts import insert_one_params, insert_one_sql
from dispatcher.db.port import NewJob
from dispatcher.db.queries import query


def _key(job: NewJob) -> dict[str, Any]:
    return {"queue": job.queue, "dedupe_key": job.dedupe_key}


def _window(job: NewJob, job_id: int) -> dict[str, Any]:
    return {**_key(job), "job_id": job_id, "window_s": job.dedupe_window_s}


def _own_transaction_async(conn: psycopg.AsyncConnection[Any]) -> AbstractAsyncContextManager[Any]:
    """The lock must live until the job's row commits: in autocommit mode a transaction of our own
    holds it; otherwise the caller's (begun by our first statement, if none was) does."""
    return conn.transaction() if conn.autocommit else nullcontext()


def _own_transaction_sync(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    return conn.transaction() if conn.autocommit else nullcontext()


async def insert_windowed_async(conn: psycopg.AsyncConnection[Any], job: NewJob) -> int | None:
    """Insert one job with a window; its id, or None if its key is held (nothing written)."""
    async with _own_transaction_async(conn):
        held = rows.value(
            await (await conn.execute(query("dedupe_key_lock"), _key(job))).fetchone()
        )
        if not held:  # asked again in a snapshot taken under the lock
            cur = await conn.execute(query("dedupe_key_lock"), _key(job))
            held = rows.value(await cur.fetchone())
        if held:
            return None
        cur = await conn.execute(insert_one_sql(job), insert_one_params(job))
        job_id = rows.value(await cur.fetchone())
        if job_id is None:  # a job enqueued without a window holds the key (the live index)
            return None
        await conn.execute(query("dedupe_window_open"), _window(job, job_id))
        return int(job_id)


def insert_windowed_sync(conn: psycopg.Connection[Any], job: NewJob) -> int | None:
    with _own_transaction_sync(conn):
        held = rows.value(conn.execute(query("dedupe_key_lock"), _key(job)).fetchone())
        if not held:
            held = rows.value(conn.execute(query("dedupe_key_lock"), _key(job)).fetchone())
        if held:
            return None
        job_id = rows.value(conn.execute(insert_one_sql(job), insert_one_params(job)).fetchone())
        if job_id is None:
            return None
        conn.execute(query("dedupe_window_open"), _window(job, job_id))
        return int(job_id)


async def refuse_staged_async(cur: psycopg.AsyncCursor[Any]) -> None:
    """Before a staged batch with windows is published: lock its windowed keys (in lock order),
    then drop its windowed rows whose key is held, in a snapshot taken under those locks."""
    await cur.execute(query("dedupe_stage_lock"))
    await cur.execute(query("dedupe_stage_refuse"))


async def open_staged_async(cur: psycopg.AsyncCursor[Any]) -> None:
    """After the publish: the windows of the batch's jobs that went in."""
    await cur.execute(query("dedupe_stage_open"))


def refuse_staged_sync(cur: psycopg.Cursor[Any]) -> None:
    cur.execute(query("dedupe_stage_lock"))
    cur.execute(query("dedupe_stage_refuse"))


def open_staged_sync(cur: psycopg.Cursor[Any]) -> None:
    cur.execute(query("dedupe_stage_open"))
