"""The typed rows the job store returns and takes: what the worker sees of the jobs table.

Built at the boundary (dispatcher/db/store.py) from the driver's tuples, so nothing past the store
handles a database row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dispatcher.model import FailureKind, Job, Outcome


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim's jobs, and how many its selection found (jobs plus those others took meanwhile).
    `stale`: the flow-control tables changed since the worker read them, so it claimed nothing."""

    jobs: list[Job]
    selected: int
    stale: bool = False


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
class GatedClaim:
    """What a gated claim did: the jobs, how many it was allowed (None: no limit bound it below
    what it asked), which limit held it back ("max_running", "per_second", or None), and for a
    rate, how long until the next job may start."""

    claimed: Claimed
    allowed: int | None = None
    held_by: str | None = None
    wait_s: float | None = None


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
class KeyedCompletion:
    """A keyed completion's outcome: rows completed, the next jobs it claimed for its worker, and
    the ids it refused (fenced)."""

    completed: int
    claimed: list[Job]
    fenced: list[int] = field(default_factory=list)


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
