"""The job as every layer sees it: its statuses, the `Job` a handler receives, and how an attempt
ended.

The bottom of the package: it imports nothing of ours but the constants, and every layer may
import it.
"""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from dispatcher.constants import DEFAULT_QUEUE

STATUS_QUEUED: Final = "queued"
STATUS_RUNNING: Final = "running"
STATUS_COMPLETED: Final = "completed"
STATUS_FAILED: Final = "failed"
STATUS_DISCARDED: Final = "discarded"
STATUS_CANCELLED: Final = "cancelled"  # by an operator (dispatcher jobs cancel): never retried
# A job with an ordering key behind an earlier job of its key: no claim sees it until that one ends.
STATUS_WAITING: Final = "waiting"
# A job whose parents (depends_on) have not all completed: no claim sees it until the last one has.
STATUS_BLOCKED: Final = "blocked"
STATUSES: Final = (
    STATUS_QUEUED,
    STATUS_RUNNING,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_DISCARDED,
    STATUS_CANCELLED,
    STATUS_WAITING,
    STATUS_BLOCKED,
)
# Where a job's life ends: nothing changes it any more, except an operator (retry, purge) or the
# pruner.
FINISHED_STATUSES: Final = (STATUS_COMPLETED, STATUS_FAILED, STATUS_DISCARDED, STATUS_CANCELLED)


class ProgressSink(Protocol):
    """Where a running handler's reports go (`Job.set_progress`, `Job.update_meta`): a worker's
    coalescer (dispatcher/runtime/progress.py), or dispatcher.testing's. Each checks the value
    (dispatcher/job_reports.py) and raises ProgressError, in the handler, for one it cannot
    store."""

    def set_progress(self, job: Job, value: Any) -> None: ...

    def update_meta(self, job: Job, changes: Mapping[str, Any]) -> None: ...


# Set once by whatever runs handlers, in the context their tasks and threads start from (never per
# job): a Job reaches its sink through it, with no field of its own.
PROGRESS_SINK: contextvars.ContextVar[ProgressSink | None] = contextvars.ContextVar(
    "dispatcher_progress_sink", default=None
)


def _sink(what: str) -> ProgressSink:
    sink = PROGRESS_SINK.get()
    if sink is None:
        raise RuntimeError(
            f"{what}() reports to a worker: call it inside a handler that a worker, "
            "dispatcher.testing's Runner or perform_job runs (not in a thread of the handler's own)"
        )
    return sink


class Job:
    """A claimed job as handlers see it. Slotted: one is built per job on the hot path.

    `token` is the claim's fencing token as a string (one uuid per claim statement, shared by the
    batch): kept as text so writes can send it without a per-job conversion. `queue` is the queue
    the claim read (one per statement), not a column read back per row. `locked_at` arrives from
    the claim as epoch seconds and becomes a datetime when first read (why: the claim's comment
    in dispatcher/db/sql/claim.sql). `ordering_key` is the job's key, or None: the jobs of a
    queue that share one run one at a time, in the order they were enqueued. `scheduled_for` is
    the slot a recurring job was enqueued for (UTC; None for other jobs): a handler can be
    idempotent per slot with it. `trace_context` is the W3C trace context of the span that
    enqueued it (None: none, or no OpenTelemetry), which its handler's span continues
    (dispatcher/observe/tracing.py)."""

    __slots__ = (
        "_locked_at",
        "_scheduled_for",
        "attempts",
        "bucket",
        "id",
        "job_type",
        "max_attempts",
        "ordering_key",
        "payload",
        "priority",
        "queue",
        "token",
        "trace_context",
    )

    def __init__(
        self,
        id: int,
        job_type: str,
        payload: Any,
        attempts: int,
        max_attempts: int | None,
        locked_at: float | datetime | None,
        bucket: int,
        priority: int,
        ordering_key: str | None,
        token: str,
        queue: str = DEFAULT_QUEUE,
        scheduled_for: datetime | None = None,
        trace_context: dict[str, str] | None = None,
    ) -> None:
        # Built by dispatcher/db/rows.py from a claim's rows (one positional call per row: the hot
        # path), and by the in-memory store and tests with these names.
        self.id = id
        self.job_type = job_type
        self.payload = payload
        self.attempts = attempts
        self.max_attempts = max_attempts
        self._locked_at = locked_at
        self.bucket = bucket
        self.priority = priority
        self.ordering_key = ordering_key
        self.token = token
        self.queue = queue
        self._scheduled_for = scheduled_for
        self.trace_context = trace_context

    @property
    def locked_at(self) -> datetime | None:
        """When the claim took the job, on the database's clock (UTC)."""
        at = self._locked_at
        if isinstance(at, float):
            at = self._locked_at = datetime.fromtimestamp(at, UTC)
        return at

    @property
    def scheduled_for(self) -> datetime | None:
        """The slot of a recurring job (UTC, whatever the session's time zone), else None."""
        at = self._scheduled_for
        return None if at is None else at.astimezone(UTC)

    # -- what a running handler reports (docs/guides/jobs.md#progress-and-metadata) --------------

    async def set_progress(self, value: Any) -> None:
        """Record the job's progress: any JSON value (a number 0-100, {"done": n, "total": m}),
        at most 8 KiB as JSON. The latest value is written with the next batch (at most every
        DISPATCHER_PROGRESS_FLUSH_S) and before the job's outcome; ProgressError if it cannot be
        stored. Shown by `dispatcher jobs show` and the dashboard."""
        _sink("set_progress").set_progress(self, value)

    def set_progress_sync(self, value: Any) -> None:
        """`set_progress` for a sync (def) handler."""
        _sink("set_progress_sync").set_progress(self, value)

    async def update_meta(self, changes: Mapping[str, Any]) -> None:
        """Merge `changes` (a dict of JSON values, at most 8 KiB as JSON) into the job's `meta`,
        key by key (a shallow merge: a key given replaces its value); written as set_progress
        is."""
        _sink("update_meta").update_meta(self, changes)

    def update_meta_sync(self, changes: Mapping[str, Any]) -> None:
        """`update_meta` for a sync (def) handler."""
        _sink("update_meta_sync").update_meta(self, changes)

    def __repr__(self) -> str:
        return (
            f"Job(id={self.id}, job_type={self.job_type!r}, "
            f"attempt={self.attempts}/{self.max_attempts})"
        )


class FailureKind(enum.Enum):
    ERROR = "error"  # the handler raised (any exception, BaseException included)
    TIMEOUT = "timeout"  # the handler overran its time limit
    PERMANENT = "permanent"  # the handler raised PermanentJobError: no retry
    UNKNOWN_TYPE = "unknown_type"  # no handler for the job type (dispatcher.testing.Runner)
    INTERRUPTED = "interrupted"  # the worker shut down while the handler ran: retry at once
    LEASE_EXPIRED = "lease_expired"  # the owner stopped renewing the lease: died or stalled
    CANCELLED = "cancelled"  # an operator asked to cancel it (dispatcher jobs cancel): no retry
    CANCELLED_BY_HANDLER = "cancelled_by_handler"  # its handler raised Cancel: no retry


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # 'queued' (retry after delay_s), 'failed', 'discarded' or 'cancelled'
    delay_s: float
    error: str  # the text stored in last_error, at most LAST_ERROR_MAX_CHARS
    # The limit the decision used (the job's, else its handler's, else 20): for the log lines.
    max_attempts: int | None = field(default=None, compare=False)

    @property
    def retried(self) -> bool:
        return self.status == STATUS_QUEUED
