"""The typed rows the job store returns and takes, and the one place that reads the driver's rows.

Every statement's result becomes a typed row here, by the builder functions at the bottom: they
alone know a statement's column order, so nothing past this module indexes or unpacks a database
row (the store, the admin API, the maintenance services and the dev tools all call them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

# The operator's rows (operator_rows.py), re-exported: rows.X names every typed row.
from dispatcher.db.operator_rows import BucketOwnerRow as BucketOwnerRow
from dispatcher.db.operator_rows import JobIdRange as JobIdRange
from dispatcher.db.operator_rows import JobsMatch as JobsMatch
from dispatcher.db.operator_rows import LeaderRow as LeaderRow
from dispatcher.db.operator_rows import LimitKey as LimitKey
from dispatcher.db.operator_rows import MemberRow as MemberRow
from dispatcher.db.operator_rows import RecentOutcomes as RecentOutcomes
from dispatcher.db.operator_rows import RunSpans as RunSpans
from dispatcher.db.operator_rows import StatusCount as StatusCount
from dispatcher.model import FailureKind, Job, Outcome

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim's jobs, and how many its selection found (jobs plus those others took meanwhile).
    `stale`: the flow-control tables changed since the worker read them, so it claimed nothing.
    A gated claim (a `Gate`) also says how many it was allowed (None: no limit bound it below
    what it asked), which limit held it back ("max_running", "per_second", or None), and for a
    rate, how long until the next job may start. `waited_s`: each job's wait from due to claim,
    in job order (the queue-wait metric, recorded once the claim committed). `outranked`: a claim
    window's veto held (sql/claim.sql, claim_window): nothing was claimed, because another of the
    claimer's buckets has a due job of better priority than the window's selection."""

    jobs: list[Job]
    selected: int
    stale: bool = False
    outranked: bool = False
    allowed: int | None = None
    held_by: str | None = None
    wait_s: float | None = None
    waited_s: list[float] = field(default_factory=list, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TypeFilter:
    """Which job types a claim may take: only `types` (include) or every type but them."""

    types: tuple[str, ...]
    include: bool


@dataclass(frozen=True, slots=True)
class Limit:
    """One flow-control limit (dispatcher_limits): on jobs of `job_type` in `queue` ('*': any)."""

    job_type: str
    queue: str
    max_running: int | None
    per_second: float | None
    burst_jobs: float = 1.0


@dataclass(frozen=True, slots=True)
class FlowState:
    """A worker's copy of the flow-control tables, as of `version`."""

    version: int = 0
    paused: frozenset[str] = frozenset()
    limits: tuple[Limit, ...] = ()


@dataclass(frozen=True, slots=True)
class Gate:
    """A gated claim (dispatcher/db/claims.py): jobs of `types`, claimed under the limit rows
    `keys` ((job_type, queue) pairs), which it locks first."""

    types: TypeFilter | None
    keys: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Steal:
    """What a stealing claim may take: jobs from the tail of `buckets`, visited in that order,
    each bucket keeping its first `reserve` due jobs for its owner (claim_select_steal)."""

    buckets: tuple[int, ...]
    reserve: int = 0


@dataclass(frozen=True, slots=True)
class Chain:
    """What a keyed completion may claim for its worker (ordering_chain_next): the next jobs of the
    keys it releases that are due and in these (queue, bucket) pairs, at most `limit`, leased for
    `lease_s`. No pairs, or a limit of 0: it claims nothing, every next job is queued."""

    queues: tuple[str, ...] = ()
    buckets: tuple[int, ...] = ()
    limit: int = 0
    lease_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Completion:
    """A completion's outcome (jobs_complete): rows completed, the ids it refused (fenced: their
    token changed), and what a keyed completion claimed for its worker (`Chain`): the jobs, and
    each one's wait from due to claim."""

    completed: int
    fenced: list[int] = field(default_factory=list)
    claimed: list[Job] = field(default_factory=list)
    waited_s: list[float] = field(default_factory=list, compare=False, repr=False)
    # the completed jobs that have dependents: their children are released next (dependencies.py)
    parents: list[int] = field(default_factory=list, compare=False)


class JobEnd(NamedTuple):
    """What an awaited job's wait reads (job_result_watch, job_result_read)."""

    status: str
    result: Any
    last_error: str | None


class ResultText(NamedTuple):
    """A handler's return value as stored (JSON text), or why it was not (then text is None)."""

    text: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    """A running job whose lease ran out: what the retry policy and the reaper's log need."""

    id: int
    token: str
    attempts: int
    max_attempts: int | None  # None: not given at enqueue (the handler's, else 20)
    lease_expiries: int  # including this expiry
    locked_by: str | None
    locked_at: datetime | None
    # an operator asked to cancel it: it ends cancelled, never retried
    cancel_requested: bool = False
    job_type: str | None = None  # whose handler's on_ordered_failure applies, if the job is keyed
    keyed: bool = False  # it has an ordering key
    bucket: int | None = None  # its shard's key on a distributed table (dispatcher/db/sharded.py)


@dataclass(frozen=True, slots=True)
class FailedWrite:
    """A failure row as written (fenced rows are absent)."""

    id: int
    status: str
    attempts: int
    locked_by: str | None
    locked_at: datetime | None
    # For the outcome lines (joblog.py): when a retry is due (the database's clock), and what the
    # reaper, which holds no Job, reports of the job.
    run_at: datetime | None = None
    job_type: str | None = None
    queue: str | None = None
    bucket: int | None = None
    max_attempts: int | None = None
    # a keyed job that ended failed or discarded and now halts its key
    ordering_halted: bool = False
    # a snooze within DISPATCHER_MAX_SNOOZES: queued again, its attempt given back
    snoozed: bool = False
    # it ended (not retried) and some job depends on it: its children are released next
    releases: bool = False


@dataclass(frozen=True, slots=True)
class OrderingScan:
    """One page of the sweep for ordering keys with waiting jobs and no holder
    (ordering_promote_scan)."""

    last_key: str | None  # where the next page starts; None: the scan reached the end
    scanned: int
    promoted: int


@dataclass(frozen=True, slots=True)
class DbPressure:
    """What the queue costs the database (cumulative counters are since the stats were reset)."""

    n_live_tup: int
    n_dead_tup: int
    seq_scan: int
    idx_scan: int
    n_tup_upd: int
    n_tup_hot_upd: int
    claim_idx_tup_read: int
    lock_waits: int  # our sessions (application_name dispatcher-*) waiting on a lock
    # sessions of this database running a statement, the sampler's own excluded
    active_sessions: int


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """One row of query queue_depth: jobs of one queue in one status (oldest_due_age_s: queued
    only)."""

    queue: str
    status: str  # queued (due), scheduled, running, failed
    jobs: int
    oldest_due_age_s: float | None


@dataclass(frozen=True, slots=True)
class JobState:
    """A job's row as it is now (`job_get`, admin_job_show): every column but the fencing token."""

    id: int
    queue: str
    job_type: str
    status: str
    priority: int
    bucket: int
    attempts: int
    max_attempts: int | None  # None: not given at enqueue (the handler's, else 20)
    lease_expiries: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    locked_at: datetime | None
    locked_by: str | None
    lease_expires_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    cancel_requested_at: datetime | None
    dedupe_key: str | None
    payload: Any
    last_error: str | None
    ordering_key: str | None = None
    # it ended failed or discarded and holds its key until retried or cancelled
    ordering_halted: bool = False
    snoozes: int = 0  # times it raised Snooze (DISPATCHER_MAX_SNOOZES)
    # every failed attempt's error, oldest first: [{"attempt", "at", "error"}] (migration 0015);
    # None until an attempt failed
    errors: list[dict[str, Any]] | None = None
    tags: list[str] | None = None  # as given at enqueue, duplicates dropped; None: no tags
    progress: Any = None  # what its handler last reported (Job.set_progress): any JSON value
    meta: dict[str, Any] | None = None  # its handler's Job.update_meta, merged; None: none
    depends_on: list[int] | None = None  # the parents it was enqueued with (None: none)
    pending_parents: int | None = None  # how many of them it still waits for (status blocked)
    batch_id: int | None = None  # its batch (the callback's id), if it is in one
    result: Any = None  # its handler's return value, once it completed


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt to record, fenced by the claim's token; its outcome is the retry
    policy's decision. `job`, `kind` and `summary` (the error in one line) are for its log line
    (joblog.py), set by the executor's failures. `halts`: if the job has an ordering key and this
    attempt ends it failed or discarded, its key halts (the handler's on_ordered_failure).
    `snooze`: (seconds, cap) of a `raise Snooze(seconds)`: written as a snooze while the job has
    snoozed fewer than cap times, else as `outcome` (jobs_fail_owned)."""

    id: int
    token: str
    outcome: Outcome
    job: Job | None = None
    kind: FailureKind | None = None
    summary: str | None = None
    halts: bool = True
    snooze: tuple[float, int] | None = None
    duration_s: float = 0.0  # the handler's run time, for its metrics and history row
    bucket: int | None = None  # the job's bucket (else job.bucket): a distributed table needs it


@dataclass(slots=True)
class HistoryRows:
    """Rows for dispatcher_job_attempts, column by column (one array parameter each)."""

    ids: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    started_at: list[datetime | None] = field(default_factory=list)
    durations_ms: list[float | None] = field(default_factory=list)  # None: until the write's now()
    outcomes: list[str] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)

    def add(
        self,
        job_id: int,
        attempt: int,
        worker: str,
        started_at: datetime | None,
        duration_ms: float | None,
        outcome: str,
        error: str | None,
    ) -> None:
        self.ids.append(job_id)
        self.attempts.append(attempt)
        self.workers.append(worker)
        self.started_at.append(started_at)
        self.durations_ms.append(duration_ms)
        self.outcomes.append(outcome)
        self.errors.append(error)

    def extend(self, other: HistoryRows) -> None:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))

    def __len__(self) -> int:
        return len(self.ids)


class LimitLock(NamedTuple):
    """One limit row a gated claim locked (flow_gate_lock): its caps, and its rate's tokens now."""

    job_type: str
    queue: str
    max_running: int | None
    per_second: float | None
    tokens: float | None
    read_at: datetime  # the database clock the tokens were counted at (flow_gate_spend's too)


class WrittenJob(NamedTuple):
    """One row of an operator's write (admin_jobs_cancel, _retry, _purge: sql/admin.sql). Each id
    comes back as it was before (`before`, `matches` the filters, `dedupe_held`, `halted`), and
    a changed one once more as written (`status`, `queue`, and the `ordering_key` it lets go on)."""

    id: int
    before: str | None  # None: no such job
    # The three flags are NULL on a row as written (it reads `status`, `queue`, `ordering_key`).
    matches: bool
    status: str | None
    dedupe_held: bool
    halted: bool
    queue: str | None
    ordering_key: str | None


def released_keys(written: Iterable[WrittenJob], statuses: Iterable[str]) -> list[tuple[str, str]]:
    """The (queue, ordering key) pairs that rows written into one of `statuses` let go on (the
    admin writes return a key only where it may: sql/admin.sql), sorted."""
    into = set(statuses)
    return sorted(
        {
            (w.queue, w.ordering_key)
            for w in written
            if w.queue is not None and w.ordering_key is not None and w.status in into
        }
    )


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """A schedules_read row: the database's copy of a schedule."""

    name: str
    fingerprint: str
    next_slot_at: datetime
    removed: bool
    last_success_at: datetime | None
    declared_at: datetime


class SettledRuns(NamedTuple):
    """schedule_runs_settle's row: runs settled, and each schedule's latest success (epoch s)."""

    settled: int
    succeeded: dict[str, float]


class PruneAges(NamedTuple):
    """janitor_ages' row: seconds since the oldest completed job, the oldest failed or discarded
    one, and the oldest history row (None: none)."""

    completed: float | None
    failed: float | None
    history: float | None


class ArchiveUpkeep(NamedTuple):
    """archive_maintain's row: archive partitions created and dropped, default-partition rows
    deleted past retention, and the age of the oldest range partition's upper bound or default
    row left (None: the archive has neither)."""

    created: int
    dropped: int
    default_deleted: int
    oldest_age_s: float | None


class ArchivePartition(NamedTuple):
    """archive_partitions' rows: a partition of the archive, its bounds (None: the default one),
    and the planner's estimate of its rows."""

    name: str
    from_at: datetime | None
    to_at: datetime | None
    rows_estimate: int


# -- builders: a statement's rows (the driver's tuples) as typed rows ----------------------------
#
# The claim and completion builders are the hot path: one positional Job(...) per row, unpacked
# from the row in the statement's column order, no dict and no row factory (cheaper than the
# slicing Job did itself).


def claimed(rows: Sequence[Any], token: str, queue: str) -> Claimed:
    """A claim's rows (jobs_claim, sql/claim.sql): `selected` rides on every row, and the
    statement returns one row of NULLs with it when it claimed nothing (`selected` NULL too when
    the flow-control version did not match: stale), and a claim window's with `outranked`."""
    if not rows:
        return Claimed([], 0)
    first = rows[0]
    selected = first[9]
    if selected is None:
        return Claimed([], 0, stale=True)
    if first[0] is None:
        return Claimed([], selected, outranked=len(first) > 13 and bool(first[13]))
    if len(first) > 13:  # a claim window's rows: `outranked` (false) last
        rows = [row[:13] for row in rows]
    jobs = [
        Job(
            job_id,
            job_type,
            payload,
            attempts,
            max_attempts,
            locked_at,
            bucket,
            priority,
            ordering_key,
            token,
            queue,
            scheduled_for,
            trace_context,
        )
        for (
            job_id,
            job_type,
            payload,
            attempts,
            max_attempts,
            locked_at,
            bucket,
            priority,
            ordering_key,
            _selected,
            scheduled_for,
            _waited_s,
            trace_context,
        ) in rows
    ]
    return Claimed(jobs, selected, waited_s=[row[11] for row in rows])


def completion_fenced(row: Sequence[Any] | None, asked: int) -> Completion:
    """A keyless completion's one row (jobs_complete_owned_fenced): the ids it refused."""
    fenced: list[int] = row[0] if row else []
    return Completion(asked - len(fenced), fenced, parents=row[1] if row and len(row) > 1 else [])


def completion_keyed(rows: Sequence[Any], token: str) -> Completion:
    """A keyed completion's rows (jobs_complete_owned_keyed, sql/ordering.sql): one per job it
    claimed for its worker (or one row of NULLs), each with the count completed and the ids
    refused."""
    if not rows:
        return Completion(0)
    first = rows[0]
    jobs = [
        Job(
            job_id,
            job_type,
            payload,
            attempts,
            max_attempts,
            locked_at,
            bucket,
            priority,
            ordering_key,
            token,
            queue,
            None,
            trace_context,
        )
        for (
            job_id,
            job_type,
            payload,
            attempts,
            max_attempts,
            locked_at,
            bucket,
            priority,
            ordering_key,
            queue,
            _completed,
            _promoted,
            _fenced,
            _waited_s,
            trace_context,
            _parents,
            _notified,
        ) in rows
        if job_id is not None
    ]
    waited_s = [row[13] for row in rows] if jobs else []
    return Completion(int(first[10]), first[12], jobs, waited_s, first[15])


def flow_state(row: Sequence[Any]) -> FlowState:
    """The flow-control tables in one row (flow_state): the version, the paused queues, and the
    limits column by column (one array each)."""
    version, paused, types, queues, max_running, per_second, burst = row
    limits = tuple(
        Limit(*values) for values in zip(types, queues, max_running, per_second, burst, strict=True)
    )
    return FlowState(int(version), frozenset(paused), limits)


def lease_extensions(rows: Iterable[Sequence[Any]]) -> dict[int, bool]:
    """jobs_extend_leases' rows: each job still ours, with whether a cancel was requested."""
    return {job_id: cancel_requested for job_id, cancel_requested in rows}


def typed(row_type: Callable[..., T], rows: Iterable[Sequence[Any]]) -> list[T]:
    """Rows whose columns are `row_type`'s fields, in order (the statement's comment names them)."""
    return [row_type(*row) for row in rows]


def typed_one(row_type: Callable[..., T], row: Sequence[Any] | None) -> T | None:
    """One such row; None if the statement returned none."""
    return None if row is None else row_type(*row)


def value(row: Sequence[Any] | None) -> Any:
    """A one-column row's value; None if the statement returned no row."""
    return None if row is None else row[0]


def values(rows: Iterable[Sequence[Any]]) -> list[Any]:
    """The values of one-column rows."""
    return [only for (only,) in rows]


def stored_schedules(rows: Iterable[Sequence[Any]]) -> dict[str, StoredSchedule]:
    """schedules_read's rows by schedule name (its first column, the database's now, is not
    kept)."""
    return {
        name: StoredSchedule(name, fingerprint, next_slot_at, removed, last_success_at, declared_at)
        for _now, name, fingerprint, next_slot_at, removed, last_success_at, declared_at in rows
    }


def pairs(rows: Iterable[Sequence[Any]]) -> dict[Any, Any]:
    """Two-column rows (a key, its value: status_halted_keys and the like) as a dict."""
    return {key: column for key, column in rows}


def as_dicts(cursor: Any) -> list[dict[str, Any]]:
    """A cursor's rows as dicts by column name: for the reads that hand a row on as a mapping
    (a job's detail, a limit in `dispatcher status --json`)."""
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
