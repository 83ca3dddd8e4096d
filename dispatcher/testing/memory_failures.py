"""Failed attempts in the in-memory store: the rules of jobs_fail_owned (sql/finish.sql) without
PostgreSQL: the retry policy's outcome written where the token still matches, a snooze within its
cap queued again with its attempt given back, a retry of a job with a cancel request ending it
cancelled, a keyed job's key halted or released, every failed attempt's error kept."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from dispatcher.db.rows import FailedWrite, Failure, JobState
from dispatcher.model import STATUS_CANCELLED, STATUS_DISCARDED, STATUS_FAILED, STATUS_QUEUED
from dispatcher.runtime.retry import with_attempt_error
from dispatcher.testing.clock import FakeClock


class MemoryStore(Protocol):
    """What of the in-memory store (memory_store.py) this reads and writes."""

    clock: FakeClock

    def _owned(self, job_id: int, token: str) -> JobState | None: ...

    def _write(self, row: JobState, token: str | None = None, **changes: Any) -> JobState: ...

    def _release(self, row: JobState) -> None: ...


def write_failures(
    store: MemoryStore, failures: Sequence[Failure], lease_expired: bool
) -> list[FailedWrite]:
    """The rows written (fenced ones are absent); the caller holds the store's lock."""
    now, written = store.clock.now(), []
    for f in failures:
        row = store._owned(f.id, f.token)
        if row is None or (
            lease_expired and not (row.lease_expires_at and row.lease_expires_at < now)
        ):
            continue
        # A snooze within its cap (jobs_fail_owned): queued again after it, its attempt
        # given back.
        snoozed = within_cap = f.snooze is not None and row.snoozes < f.snooze[1]
        status, retry, run_at = (
            f.outcome.status,
            f.outcome.status == STATUS_QUEUED or snoozed,
            row.run_at,
        )
        attempts = row.attempts
        error: str | None = f.outcome.error
        if retry and row.cancel_requested_at is not None:
            # a cancel request is honoured, never retried
            status, snoozed = STATUS_CANCELLED, False
        elif snoozed:
            status, attempts, error = (
                STATUS_QUEUED,
                max(row.attempts - 1, 0),
                row.last_error,
            )
            assert f.snooze is not None  # snoozed implies it
            run_at = now + timedelta(seconds=f.snooze[0])
        elif retry:
            run_at = now + timedelta(seconds=f.outcome.delay_s)
        failed_at = now if status in (STATUS_FAILED, STATUS_DISCARDED) else row.failed_at
        halted = (
            row.ordering_key is not None and status in (STATUS_FAILED, STATUS_DISCARDED) and f.halts
        )
        row = store._write(
            row,
            status=status,
            run_at=run_at,
            failed_at=failed_at,
            last_error=error,
            lease_expiries=row.lease_expiries + int(lease_expired),
            lease_expires_at=None,
            updated_at=now,
            ordering_halted=halted,
            attempts=attempts,
            snoozes=row.snoozes + (f.snooze is not None),
            errors=row.errors
            if within_cap
            else with_attempt_error(row.errors, row.attempts, f.outcome.error, now),
        )
        if status != STATUS_QUEUED:
            store._release(row)
        written.append(
            FailedWrite(
                row.id,
                row.status,
                row.attempts,
                row.locked_by,
                row.locked_at,
                row.run_at,
                row.job_type,
                row.queue,
                row.bucket,
                row.max_attempts,
                halted,
                snoozed,
            )
        )
    return written
