"""Enqueue jobs: one at a time, or in bulk through COPY.

Given a connection, enqueue joins the caller's transaction (transactional outbox): the job
exists if and only if that transaction commits. Given a pool, it takes a connection and commits
on its own. Every job is validated (enqueue_checks.py) and its payload serialised *before* its
row is sent, so bad input is a clear `EnqueueError`/`PayloadError` and nothing is written.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

import psycopg
import psycopg_pool

from dispatcher.api.enqueue_checks import (
    check_dedupe_window,
    check_keys,
    check_max_payload_bytes,
    check_names,
    check_options,
    check_ordering_key,
    check_tags,
    serialize_payload,
)
from dispatcher.api.enqueue_copy import (
    CopyTally,
    copy_chunks,
    copy_plan,
    owns_transaction,
    published_async,
    published_sync,
    unbegun,
)
from dispatcher.api.enqueue_windows import (
    insert_windowed_async,
    insert_windowed_sync,
    open_staged_async,
    open_staged_sync,
    refuse_staged_async,
    refuse_staged_sync,
)
from dispatcher.constants import DEFAULT_QUEUE, NOTIFY_CHANNEL, NUM_BUCKETS
from dispatcher.db import rows
from dispatcher.db.citus import distributed_async, distributed_sync
from dispatcher.db.inserts import insert_one_params, insert_one_sql
from dispatcher.db.port import InProcessStore
from dispatcher.db.queries import query
from dispatcher.db.translate import translate_errors
from dispatcher.errors import EnqueueError, PayloadError
from dispatcher.settings.defaults import DEFAULT_MAX_PAYLOAD_BYTES


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job to enqueue. `run_at` (absolute) and `delay_s` (from the database's now()) exclude
    each other; `jitter_s` adds a uniform random 0..jitter_s seconds, the cheapest way to spread
    a burst of jobs all due at the same instant. `partition_key` maps to a stable bucket (same key,
    same bucket). `ordering_key`: the jobs of a queue that share it run one at a time, in enqueue
    order, across the fleet (docs/concepts/ordering.md); it picks the bucket as partition_key does
    (a partition_key or bucket beside it must agree). Without an ordering key, partition key or
    bucket, `dedupe_key` picks the bucket the same way; without any key the bucket is random. A
    dedupe key is unique among the live jobs of its queue and bucket: of its queue when it picked
    the bucket. `dedupe_window_s` (with a dedupe_key): the key stays held that many seconds after
    the job finished, not only while it is live (docs/guides/jobs.md). `tags`: labels to find the
    job by (`dispatcher jobs list --tag`), at most 16 of letters, digits and _ . : -."""

    job_type: str
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    run_at: datetime | None = None
    delay_s: float = 0.0
    # None: the handler's max_attempts, else DEFAULT_MAX_ATTEMPTS (20)
    max_attempts: int | None = None
    dedupe_key: str | None = None
    jitter_s: float = 0.0
    partition_key: str | None = None
    bucket: int | None = None
    ordering_key: str | None = None
    dedupe_window_s: float | None = None
    tags: Sequence[str] | None = None


class EnqueueOptions(TypedDict, total=False):
    """The keyword options of `enqueue` and `enqueue_sync`: JobSpec's fields but the type and
    payload, each as JobSpec describes it."""

    queue: str
    priority: int
    run_at: datetime | None
    delay_s: float
    max_attempts: int | None
    dedupe_key: str | None
    jitter_s: float
    partition_key: str | None
    bucket: int | None
    ordering_key: str | None
    dedupe_window_s: float | None
    tags: Sequence[str] | None


class PayloadsOptions(TypedDict, total=False):
    """The keyword options of `enqueue_payloads` and `enqueue_payloads_sync`: shared by every job
    (`tags` too), but `partition_keys` or `ordering_keys`, one per payload (None: that job has no
    key)."""

    queue: str
    priority: int
    run_at: datetime | None
    delay_s: float
    max_attempts: int | None
    jitter_s: float
    partition_keys: Sequence[str] | None
    ordering_keys: Sequence[str | None] | None
    tags: Sequence[str] | None


def bucket_for(partition_key: str) -> int:
    """Stable across processes and releases (unlike hash()): crc32 of the UTF-8 key."""
    return zlib.crc32(partition_key.encode()) % NUM_BUCKETS


@dataclass(slots=True)
class _Prepared:
    queue: str
    job_type: str
    payload: bytes
    priority: int
    bucket: int
    max_attempts: int | None
    run_at: datetime | None
    delay_s: float
    dedupe_key: str | None
    ordering_key: str | None = None
    dedupe_window_s: float | None = None
    tags: tuple[str, ...] | None = None


def _pick_bucket(
    bucket: int | None,
    partition_key: str | None,
    ordering_key: str | None = None,
    dedupe_key: str | None = None,
) -> int:
    """The job's bucket, from the first of: its ordering key, its bucket or partition key, its
    dedupe key, chance. A key that places its job makes the job's unique index, which includes
    the bucket (migration 0014), mean what it says: one live job per (queue, key)."""
    if ordering_key is not None:
        keyed = bucket_for(ordering_key)
        if partition_key is not None and bucket_for(partition_key) != keyed:
            raise EnqueueError(
                f"partition_key {partition_key!r} maps to bucket {bucket_for(partition_key)} and "
                f"ordering_key {ordering_key!r} to bucket {keyed}: give one of them",
                "partition_key",
            )
        if bucket is not None and bucket != keyed:
            raise EnqueueError(
                f"bucket {bucket} is not ordering_key {ordering_key!r}'s bucket ({keyed}): "
                f"leave bucket out",
                "bucket",
            )
        return keyed
    if bucket is not None:
        return bucket
    if partition_key is not None:
        return bucket_for(partition_key)
    if dedupe_key is not None:
        return bucket_for(dedupe_key)
    return int(random.random() * NUM_BUCKETS)


def _prepare(spec: JobSpec, max_payload_bytes: int) -> _Prepared:
    check_names(spec.queue, spec.job_type)
    check_options(spec.priority, spec.max_attempts, spec.delay_s, spec.jitter_s, spec.run_at)
    check_keys(spec.bucket, spec.partition_key, spec.dedupe_key, spec.ordering_key)
    check_dedupe_window(spec.dedupe_window_s, spec.dedupe_key)
    delay = spec.delay_s + (random.uniform(0.0, spec.jitter_s) if spec.jitter_s else 0.0)
    return _Prepared(
        spec.queue,
        spec.job_type,
        serialize_payload(spec.payload, max_payload_bytes),
        spec.priority,
        _pick_bucket(spec.bucket, spec.partition_key, spec.ordering_key, spec.dedupe_key),
        spec.max_attempts,
        spec.run_at,
        delay,
        spec.dedupe_key,
        spec.ordering_key,
        None if spec.dedupe_window_s is None else float(spec.dedupe_window_s),
        tags=None if spec.tags is None else check_tags(spec.tags),
    )


def _prepare_one(
    job_type: str, payload: Any, max_payload_bytes: int, options: EnqueueOptions
) -> _Prepared:
    check_max_payload_bytes(max_payload_bytes)
    return _prepare(JobSpec(job_type, payload, **options), max_payload_bytes)


def _prepare_all(specs: Iterable[JobSpec], max_payload_bytes: int) -> Iterator[_Prepared]:
    """Validate and serialise lazily: rows are prepared while earlier COPY chunks are already on
    their way. A bad row raises inside the enqueue transaction, which then rolls back whole."""
    check_max_payload_bytes(max_payload_bytes)
    for index, spec in enumerate(specs):
        try:
            yield _prepare(spec, max_payload_bytes)
        except EnqueueError as exc:
            raise EnqueueError(f"job #{index} ({spec.job_type!r}): {exc}", exc.option) from None
        except PayloadError as exc:
            raise PayloadError(f"job #{index} ({spec.job_type!r}): {exc}") from None


def _prepare_payloads(
    job_type: str,
    payloads: Iterable[Any],
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: datetime | None = None,
    delay_s: float = 0.0,
    max_attempts: int | None = None,
    jitter_s: float = 0.0,
    partition_keys: Sequence[str] | None = None,
    ordering_keys: Sequence[str | None] | None = None,
    tags: Sequence[str] | None = None,
    max_payload_bytes: int,
) -> Iterator[_Prepared]:
    """The columnar form of _prepare_all: options are checked once, here and now (before any
    statement is sent), payloads one by one as the COPY consumes them. `ordering_keys`: one per
    payload (None: that job has none), in place of partition_keys."""
    check_names(queue, job_type)
    check_options(priority, max_attempts, delay_s, jitter_s, run_at)
    check_max_payload_bytes(max_payload_bytes)
    shared_tags = check_tags(tags)
    if partition_keys is not None and ordering_keys is not None:
        raise EnqueueError(
            "give partition_keys or ordering_keys, not both (an ordering key picks the bucket)",
            "partition_keys",
        )
    keys, option = (
        (ordering_keys, "ordering_keys")
        if ordering_keys is not None
        else (partition_keys, "partition_keys")
    )
    if keys is not None:
        if not isinstance(payloads, Sized):
            payloads = list(payloads)
        if len(keys) != len(payloads):
            raise EnqueueError(f"{len(keys)} {option} for {len(payloads)} payloads", option)
    prepared = _iter_payloads(
        job_type,
        payloads,
        queue,
        priority,
        run_at,
        delay_s,
        max_attempts,
        jitter_s,
        keys,
        ordering_keys is not None,
        max_payload_bytes,
    )
    return prepared if shared_tags is None else _tagged(prepared, shared_tags)


def _tagged(prepared: Iterator[_Prepared], tags: tuple[str, ...]) -> Iterator[_Prepared]:
    """enqueue_payloads' shared tags on each job: a step only tagged batches take."""
    for p in prepared:
        p.tags = tags
        yield p


def _iter_payloads(
    job_type: str,
    payloads: Iterable[Any],
    queue: str,
    priority: int,
    run_at: datetime | None,
    delay_s: float,
    max_attempts: int | None,
    jitter_s: float,
    keys: Sequence[str | None] | None,
    ordering: bool,
    max_payload_bytes: int,
) -> Iterator[_Prepared]:
    serialize, rand, uniform = serialize_payload, random.random, random.uniform
    option = "ordering_keys" if ordering else "partition_keys"
    for index, payload in enumerate(payloads):
        try:
            data = serialize(payload, max_payload_bytes)
        except PayloadError as exc:
            raise PayloadError(f"job #{index}: {exc}") from None
        key = None if keys is None else keys[index]
        ordering_key = None
        if key is None:
            if keys is not None and not ordering:
                raise EnqueueError(
                    f"job #{index}: partition_key must be a string, got NoneType", option
                )
            bucket = int(rand() * NUM_BUCKETS)
        elif not isinstance(key, str):
            raise EnqueueError(
                f"job #{index}: {option[:-1]} must be a string, got {type(key).__name__}", option
            )
        else:
            if ordering:
                try:
                    check_ordering_key(key, option)
                except EnqueueError as exc:
                    raise EnqueueError(f"job #{index}: {exc}", option) from None
                ordering_key = key
            bucket = bucket_for(key)
        delay = delay_s + uniform(0.0, jitter_s) if jitter_s else delay_s
        yield _Prepared(
            queue, job_type, data, priority, bucket, max_attempts, run_at, delay, None, ordering_key
        )


def _materialize(specs: Iterable[JobSpec]) -> tuple[list[JobSpec], bool]:
    """The specs as a list, and whether they go through the staging table (dedupe or ordering
    keys)."""
    specs = specs if isinstance(specs, list) else list(specs)
    return specs, any(
        spec.dedupe_key is not None or spec.ordering_key is not None for spec in specs
    )


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
) -> int | None:
    """Enqueue one job; returns its id, or None if a live job has the same (queue, dedupe_key), or
    (with `dedupe_window_s`) a job with it finished within its window."""
    prepared = _prepare_one(job_type, payload, max_payload_bytes, options)
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
) -> int | None:
    prepared = _prepare_one(job_type, payload, max_payload_bytes, options)
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
