"""Enqueue jobs: one at a time, or in bulk through COPY.

Given a connection, enqueue joins the caller's transaction (transactional outbox): the job
exists if and only if that transaction commits. Given a pool, it takes a connection and commits
on its own. Every job is validated (enqueue_checks.py) and its payload serialised *before* its
row is sent, so bad input is a clear `EnqueueError`/`PayloadError` and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Unpack

import psycopg
import psycopg_pool

from dispatcher.api.enqueue_copy import (
    CopyTally,
    copy_chunks,
    copy_plan,
    owns_transaction,
    published_async,
    published_sync,
    unbegun,
)
from dispatcher.api.enqueue_graph import graph_async, graph_sync
from dispatcher.api.enqueue_prepare import (  # JobSpec, the options, bucket_for: re-exported
    EnqueueOptions as EnqueueOptions,
)
from dispatcher.api.enqueue_prepare import JobOptions as JobOptions
from dispatcher.api.enqueue_prepare import JobSpec as JobSpec
from dispatcher.api.enqueue_prepare import PayloadsOptions as PayloadsOptions
from dispatcher.api.enqueue_prepare import (
    _graph_job,
    _materialize,
    _prepare_all,
    _prepare_one,
    _prepare_payloads,
    _Prepared,
)
from dispatcher.api.enqueue_prepare import bucket_for as bucket_for
from dispatcher.api.enqueue_windows import (
    insert_windowed_async,
    insert_windowed_sync,
    open_staged_async,
    open_staged_sync,
    refuse_staged_async,
    refuse_staged_sync,
)
from dispatcher.api.results import JobHandle, handle
from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db import rows
from dispatcher.db.citus import distributed_async, distributed_sync
from dispatcher.db.inserts import insert_one_params, insert_one_sql
from dispatcher.db.port import InProcessStore
from dispatcher.db.queries import query
from dispatcher.db.translate import translate_errors
from dispatcher.settings.defaults import DEFAULT_MAX_PAYLOAD_BYTES

# InProcessStore: dispatcher.testing's in-memory store, for users' unit tests (see _in_process).
AsyncTarget = psycopg.AsyncConnection[Any] | psycopg_pool.AsyncConnectionPool | InProcessStore
SyncTarget = psycopg.Connection[Any] | psycopg_pool.ConnectionPool | InProcessStore


def _in_process(store: InProcessStore, prepared: Iterable[_Prepared]) -> list[int | None]:
    """An in-memory store (dispatcher.testing) instead of SQL: the jobs were checked and
    serialised exactly as for PostgreSQL, all before the first is inserted."""
    return store.insert_jobs(list(prepared))


# -- async -----------------------------------------------------------------------------------------


async def enqueue(
    target: AsyncTarget,
    job_type: str,
    payload: Any = None,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    **options: Unpack[EnqueueOptions],
) -> JobHandle | None:
    """Enqueue one job; returns its id (a JobHandle: `await handle.result()` waits for the job's
    end), or None if a live job has the same (queue, dedupe_key), or (with `dedupe_window_s`) a
    job with it finished within its window."""
    return handle(
        await _enqueue_one_async(target, job_type, payload, max_payload_bytes, options), target
    )


async def _enqueue_one_async(
    target: AsyncTarget,
    job_type: str,
    payload: Any,
    max_payload_bytes: int,
    options: EnqueueOptions,
) -> int | None:
    prepared = _prepare_one(job_type, payload, max_payload_bytes, options)
    if prepared.depends_on is not None:
        return (await graph_async(target, [_graph_job(prepared)]))[0]
    if isinstance(target, InProcessStore):
        return _in_process(target, [prepared])[0]
    if isinstance(target, psycopg_pool.AsyncConnectionPool):
        async with target.connection() as conn:
            return await _insert_one_async(conn, prepared)
    return await _insert_one_async(target, prepared)


async def _insert_one_async(conn: psycopg.AsyncConnection[Any], p: _Prepared) -> int | None:
    with translate_errors("enqueue"):
        if p.dedupe_window_s is not None:
            return await insert_windowed_async(conn, p)
        cur = await conn.execute(insert_one_sql(p), insert_one_params(p))
        job_id: int | None = rows.value(await cur.fetchone())
    return job_id


async def enqueue_many(
    target: AsyncTarget,
    specs: Iterable[JobSpec],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> int:
    """Enqueue many jobs in one transaction through COPY; returns how many were inserted
    (fewer than given only when dedupe keys matched live jobs, or held windows)."""
    specs, staged = _materialize(specs)
    if not specs:
        return 0
    if any(spec.depends_on is not None for spec in specs):
        graph = [_graph_job(p) for p in _prepare_all(specs, max_payload_bytes)]
        return len(await graph_async(target, graph))
    return await _copy_async(target, _prepare_all(specs, max_payload_bytes), staged)


async def enqueue_payloads(
    target: AsyncTarget,
    job_type: str,
    payloads: Iterable[Any],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    **options: Unpack[PayloadsOptions],
) -> int:
    """Bulk-enqueue many jobs of one type that share their options (queue, priority, run_at,
    delay_s, jitter_s, max_attempts, tags; optional per-job `partition_keys` or
    `ordering_keys`): the fastest path, for bursts such as 200k renewals due at midnight. Returns
    how many were inserted."""
    prepared = _prepare_payloads(job_type, payloads, max_payload_bytes=max_payload_bytes, **options)
    return await _copy_async(target, prepared, staged=options.get("ordering_keys") is not None)


# Below this many rows a stale statistic cannot mislead the planner enough to matter.
_ANALYZE_MIN_ROWS = 5000


async def _copy_async(target: AsyncTarget, prepared: Iterator[_Prepared], staged: bool) -> int:
    if isinstance(target, InProcessStore):
        return sum(i is not None for i in _in_process(target, prepared))
    if isinstance(target, psycopg_pool.AsyncConnectionPool):
        async with target.connection() as conn:
            return await _copy_async(conn, prepared, staged)
    conn, owned, tally = target, owns_transaction(target), CopyTally()
    with translate_errors("enqueue_many"):
        if unbegun(conn):
            await conn.execute(query("db_now"))
        if staged and await distributed_async(conn):
            return await _one_by_one_async(conn, prepared)
        async with conn.transaction():
            cur = conn.cursor()
            db_now = rows.value(await (await cur.execute(query("db_now"))).fetchone())
            if staged:
                await cur.execute(query("jobs_stage_create"))
            statement, trace = copy_plan(staged, tally)
            async with cur.copy(statement) as copy:
                for chunk in copy_chunks(prepared, db_now, tally, staged, trace):
                    await copy.write(chunk)
            inserted = tally.rows
            if staged:
                if tally.windowed:
                    await refuse_staged_async(cur)
                inserted = await published_async(cur, tally)
                if tally.windowed:
                    await open_staged_async(cur)
                await cur.execute(query("jobs_stage_clear"))
            for queue in sorted(tally.queues):
                await cur.execute(
                    query("notify_enqueued"), {"channel": NOTIFY_CHANNEL, "payload": queue}
                )
        if owned and inserted >= _ANALYZE_MIN_ROWS:
            # Refresh statistics right after a bulk load, not within autovacuum's minute
            # (docs/design/enqueue.md). Only when we own the transaction, never in the caller's.
            async with conn.transaction():
                cur = await conn.execute(query("jobs_reltuples"))
                if rows.value(await cur.fetchone()) < inserted:
                    await conn.execute(query("jobs_analyze"))
    return inserted


async def _one_by_one_async(
    conn: psycopg.AsyncConnection[Any], prepared: Iterator[_Prepared]
) -> int:
    """A keyed batch on a Citus cluster: each job as `enqueue` inserts it, all in one
    transaction. Citus cannot run the staging table's joins (docs/concepts/citus.md)."""
    batch, inserted = list(prepared), 0
    async with conn.transaction():
        await conn.execute(query("dedupe_keys_lock"), _windowed_keys(batch))
        for p in batch:
            inserted += await _insert_one_async(conn, p) is not None
    return inserted


def _windowed_keys(batch: list[_Prepared]) -> dict[str, list[str]]:
    """The (queue, dedupe key) of each job of `batch` that has a window, for dedupe_keys_lock."""
    windowed = [
        (p.queue, p.dedupe_key)
        for p in batch
        if p.dedupe_window_s is not None and p.dedupe_key is not None
    ]
    return {"queues": [q for q, _ in windowed], "keys": [k for _, k in windowed]}


# -- sync (web apps, scripts, the CLI): the same steps without await ------------------------------


def enqueue_sync(
    target: SyncTarget,
    job_type: str,
    payload: Any = None,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    **options: Unpack[EnqueueOptions],
) -> JobHandle | None:
    return handle(_enqueue_one_sync(target, job_type, payload, max_payload_bytes, options), target)


def _enqueue_one_sync(
    target: SyncTarget,
    job_type: str,
    payload: Any,
    max_payload_bytes: int,
    options: EnqueueOptions,
) -> int | None:
    prepared = _prepare_one(job_type, payload, max_payload_bytes, options)
    if prepared.depends_on is not None:
        return graph_sync(target, [_graph_job(prepared)])[0]
    if isinstance(target, InProcessStore):
        return _in_process(target, [prepared])[0]
    if isinstance(target, psycopg_pool.ConnectionPool):
        with target.connection() as conn:
            return _insert_one_sync(conn, prepared)
    return _insert_one_sync(target, prepared)


def _insert_one_sync(conn: psycopg.Connection[Any], p: _Prepared) -> int | None:
    with translate_errors("enqueue"):
        if p.dedupe_window_s is not None:
            return insert_windowed_sync(conn, p)
        job_id: int | None = rows.value(
            conn.execute(insert_one_sql(p), insert_one_params(p)).fetchone()
        )
    return job_id


def enqueue_many_sync(
    target: SyncTarget,
    specs: Iterable[JobSpec],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> int:
    specs, staged = _materialize(specs)
    if not specs:
        return 0
    if any(spec.depends_on is not None for spec in specs):
        return len(
            graph_sync(target, [_graph_job(p) for p in _prepare_all(specs, max_payload_bytes)])
        )
    return _copy_sync(target, _prepare_all(specs, max_payload_bytes), staged)


def enqueue_payloads_sync(
    target: SyncTarget,
    job_type: str,
    payloads: Iterable[Any],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    **options: Unpack[PayloadsOptions],
) -> int:
    prepared = _prepare_payloads(job_type, payloads, max_payload_bytes=max_payload_bytes, **options)
    return _copy_sync(target, prepared, staged=options.get("ordering_keys") is not None)


def _copy_sync(target: SyncTarget, prepared: Iterator[_Prepared], staged: bool) -> int:
    if isinstance(target, InProcessStore):
        return sum(i is not None for i in _in_process(target, prepared))
    if isinstance(target, psycopg_pool.ConnectionPool):
        with target.connection() as conn:
            return _copy_sync(conn, prepared, staged)
    conn, owned, tally = target, owns_transaction(target), CopyTally()
    with translate_errors("enqueue_many"):
        if unbegun(conn):
            conn.execute(query("db_now"))
        if staged and distributed_sync(conn):
            return _one_by_one_sync(conn, prepared)
        with conn.transaction():
            cur = conn.cursor()
            db_now = rows.value(cur.execute(query("db_now")).fetchone())
            if staged:
                cur.execute(query("jobs_stage_create"))
            statement, trace = copy_plan(staged, tally)
            with cur.copy(statement) as copy:
                for chunk in copy_chunks(prepared, db_now, tally, staged, trace):
                    copy.write(chunk)
            inserted = tally.rows
            if staged:
                if tally.windowed:
                    refuse_staged_sync(cur)
                inserted = published_sync(cur, tally)
                if tally.windowed:
                    open_staged_sync(cur)
                cur.execute(query("jobs_stage_clear"))
            for queue in sorted(tally.queues):
                cur.execute(query("notify_enqueued"), {"channel": NOTIFY_CHANNEL, "payload": queue})
        if owned:
            refresh_statistics_sync(conn, inserted)
    return inserted


def _one_by_one_sync(conn: psycopg.Connection[Any], prepared: Iterator[_Prepared]) -> int:
    batch, inserted = list(prepared), 0
    with conn.transaction():
        conn.execute(query("dedupe_keys_lock"), _windowed_keys(batch))
        for p in batch:
            inserted += _insert_one_sync(conn, p) is not None
    return inserted


def refresh_statistics_sync(conn: psycopg.Connection[Any], inserted: int) -> None:
    """After a bulk load of `inserted` rows, outside any transaction of the caller's: refresh the
    jobs table's statistics if the planner thinks it is smaller (see _copy_async). The CLI calls
    it itself, as it enqueues inside a transaction of its own (bounded: db/oneshot.py)."""
    if inserted >= _ANALYZE_MIN_ROWS:
        with conn.transaction():
            if rows.value(conn.execute(query("jobs_reltuples")).fetchone()) < inserted:
                conn.execute(query("jobs_analyze"))
