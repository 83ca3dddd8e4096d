"""Job outcome lines: each failed attempt at WARNING, each final failure at ERROR, each reaped job.

Logged once the failure rows are written, so a line says what the database holds (`next_run_at`
is the row's run_at). One wording per kind of outcome, so the storm filter keeps them apart.
The fields: docs/operations/logs.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dispatcher.db.rows import ExpiredLease, FailedWrite, Failure
from dispatcher.model import STATUS_CANCELLED, STATUS_DISCARDED, STATUS_QUEUED, FailureKind

log = logging.getLogger("dispatcher.jobs")

# Wordings by reason; arguments: job id, attempt, max_attempts, and for a retry its delay (s).
_RETRY = "; retrying in %.3g s"
_RETRIED: dict[FailureKind, str] = {
    FailureKind.ERROR: "job %d failed (attempt %d/%d)" + _RETRY,
    FailureKind.TIMEOUT: "job %d timed out (attempt %d/%d)" + _RETRY,
    FailureKind.INTERRUPTED: (
        "job %d was interrupted by this worker's shutdown (attempt %d/%d); queued again, due in "
        "%.3g s"
    ),
    FailureKind.LEASE_EXPIRED: "reaped job %d: its lease expired (attempt %d/%d)" + _RETRY,
}
_FINAL: dict[FailureKind, str] = {
    FailureKind.ERROR: "job %d failed for good: its last attempt (%d/%d) failed",
    FailureKind.TIMEOUT: "job %d failed for good: its last attempt (%d/%d) timed out",
    FailureKind.INTERRUPTED: (
        "job %d failed for good: its last attempt (%d/%d) was interrupted by shutdown"
    ),
    FailureKind.UNKNOWN_TYPE: (
        "job %d failed: no handler for its job type in this worker (attempt %d/%d); not retried"
    ),
    FailureKind.PERMANENT: "job %d discarded: its handler raised PermanentJobError (attempt %d/%d)",
    FailureKind.LEASE_EXPIRED: (
        "reaped job %d failed for good: its lease expired on its last attempt (%d/%d)"
    ),
}


_CANCELLED = "job %d cancelled at an operator's request (attempt %d/%d); not retried"
_CANCELLED_BY_HANDLER = "job %d cancelled by its handler (attempt %d/%d); not retried"


def exception_line(exc: BaseException) -> str:
    """`module.Type: first line of the message`: the last line of a traceback, in one line."""
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = str(exc).strip()
    return f"{name}: {text.splitlines()[0]}" if text else name


def first_line(error: str) -> str:
    """An error text the executor wrote itself ("timed out after 5 s") in one line."""
    stripped = error.strip()
    return stripped.splitlines()[0] if stripped else ""


def utc(at: datetime | None) -> str | None:
    """A database timestamp as ISO-8601 UTC with milliseconds (like every line's ts)."""
    if at is None:
        return None
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def failures_written(failures: Sequence[Failure], written: Sequence[FailedWrite]) -> None:
    """The executor's failed attempts whose rows were written (fenced ones are not in `written`)."""
    by_id = {f.id: f for f in failures}
    for row in written:
        failure = by_id.get(row.id)
        # a snooze is not a failure: no line
        if failure is None or failure.job is None or row.snoozed:
            continue
        job = failure.job
        _line(
            row,
            failure.kind or FailureKind.ERROR,
            failure.outcome.delay_s,
            failure.summary if failure.summary is not None else first_line(failure.outcome.error),
            {
                "job_id": row.id,
                "job_type": job.job_type,
                "queue": job.queue,
                "bucket": job.bucket,
                "attempt": row.attempts,
                "max_attempts": failure.outcome.max_attempts or job.max_attempts,
            },
        )


def reaped(
    written: Sequence[FailedWrite], failures: Sequence[Failure], expired: Sequence[ExpiredLease]
) -> None:
    """Jobs whose lease ran out, written by the reaper: with their old owner and since when."""
    delays = {f.id: (f.outcome.delay_s, f.outcome.error) for f in failures}
    limits = {f.id: f.outcome.max_attempts for f in failures}
    expiries = {e.id: e.lease_expiries for e in expired}
    for row in written:
        delay_s, error = delays.get(row.id, (0.0, ""))
        _line(
            row,
            FailureKind.LEASE_EXPIRED,
            delay_s,
            first_line(error),
            {
                "job_id": row.id,
                "job_type": row.job_type,
                "queue": row.queue,
                "bucket": row.bucket,
                "attempt": row.attempts,
                "max_attempts": limits.get(row.id) or row.max_attempts,
                "old_owner": row.locked_by,
                "locked_since": utc(row.locked_at),
                "lease_expiries": expiries.get(row.id),
            },
        )


def _line(
    row: FailedWrite, kind: FailureKind, delay_s: float, error: str, fields: dict[str, Any]
) -> None:
    """A retry at WARNING with its next run time; a final failure (failed, discarded) at ERROR."""
    fields.update(outcome=row.status, reason=kind.value, error=error)
    args = (row.id, fields["attempt"], fields["max_attempts"] or 0)
    if row.status == STATUS_QUEUED:
        fields.update(retry_in_s=round(delay_s, 3), next_run_at=utc(row.run_at))
        log.warning(_RETRIED.get(kind, _RETRIED[FailureKind.ERROR]), *args, delay_s, extra=fields)
    elif row.status == STATUS_CANCELLED and kind is FailureKind.CANCELLED_BY_HANDLER:
        log.info(_CANCELLED_BY_HANDLER, *args, extra=fields)  # the job's own outcome: no alarm
    elif row.status == STATUS_CANCELLED:  # an operator's doing, not the job's failure: not an error
        log.warning(_CANCELLED, *args, extra=fields)
    else:
        final = FailureKind.PERMANENT if row.status == STATUS_DISCARDED else kind
        log.error(_FINAL.get(final, _FINAL[FailureKind.ERROR]), *args, extra=fields)
