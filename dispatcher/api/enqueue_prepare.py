"""What enqueue sends, prepared: `JobSpec` and the enqueue options, each job checked
(enqueue_checks.py) and its payload serialised, its bucket picked from its keys. Nothing here
talks to the database: dispatcher/api/enqueue.py sends what this prepares."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from dispatcher.api.enqueue_checks import (
    ParentFailure,
    check_dedupe_window,
    check_depends_on,
    check_keys,
    check_max_payload_bytes,
    check_names,
    check_options,
    check_ordering_key,
    check_tags,
    serialize_payload,
)
from dispatcher.constants import DEFAULT_QUEUE, NUM_BUCKETS
from dispatcher.db.dependencies import GraphJob
from dispatcher.errors import EnqueueError, PayloadError


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
    # Ids of jobs this one runs after (docs/concepts/workflows.md): it runs once every one of them
    # completed; `on_parent_failure` says what it does if one ends without success.
    depends_on: Sequence[int] | None = None
    on_parent_failure: ParentFailure = "cancel"


class JobOptions(TypedDict, total=False):
    """A job's options (a workflow step's: Workflow.add): JobSpec's fields but the type, the
    payload and its dependencies, each as JobSpec describes it."""

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


class EnqueueOptions(JobOptions, total=False):
    """The keyword options of `enqueue` and `enqueue_sync`: JobSpec's fields but the type and
    payload, each as JobSpec describes it."""

    depends_on: Sequence[int] | None
    on_parent_failure: ParentFailure


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
    depends_on: tuple[int, ...] | None = None
    on_parent_failure: str = "cancel"


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
        depends_on=check_depends_on(
            spec.depends_on, spec.on_parent_failure, spec.ordering_key, spec.dedupe_key
        ),
        on_parent_failure=spec.on_parent_failure,
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


def _graph_job(p: _Prepared) -> GraphJob:
    """A job with `depends_on` (or none, beside such jobs in enqueue_many), as a graph of its own:
    its parents exist already. A graph's insert writes no keys: a job with one beside jobs with
    parents is refused, not written without it."""
    if p.ordering_key is not None or p.dedupe_key is not None:
        raise EnqueueError(
            "an enqueue_many batch with depends_on takes no ordering_key or dedupe_key: "
            "enqueue the keyed jobs in a batch of their own",
            "ordering_key" if p.ordering_key is not None else "dedupe_key",
        )
    return GraphJob(p, external=p.depends_on or (), on_parent_failure=p.on_parent_failure)
