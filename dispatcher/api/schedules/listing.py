"""The schedules as operators see them: `dispatcher schedules list` and
`dispatcher.admin.list_schedules`.

Read from the database (migration 0012): what the holders of the queues' schedules leases
declared, the next slot, the latest run that was due and how it ended. One short bounded
transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.job_filters import check_name
from dispatcher.db import rows
from dispatcher.db.oneshot import bounded_transaction, session
from dispatcher.db.queries import query


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    queue: str
    job_type: str
    cadence: str  # the cron expression, or "every 30s"
    time_zone: str
    catch_up: str
    next_slot_at: datetime | None  # None once removed
    last_slot_at: datetime | None  # the latest slot that was due and got a job
    # How that run ended ('completed', 'failed', 'discarded', 'cancelled', 'gone'), or its job's
    # status while it is live ('queued', 'running'); None before the first run.
    last_outcome: str | None
    last_job_id: int | None
    last_success_at: datetime | None
    declared_at: datetime
    removed_at: datetime | None  # no longer declared by the code of its queue's workers


def list_schedules(
    target: str | psycopg.Connection[Any],
    *,
    queue: str | None = None,
    limits: ConnectionLimits | None = None,
) -> list[ScheduleRow]:
    """Every schedule (or those of `queue`), by name. `target`: a DSN, or a connection of yours.
    AdminInputError for a queue name no job can have."""
    if queue is not None:
        check_name(queue, "queue")
    limits = limits or ConnectionLimits()
    if isinstance(target, str):
        with session(target, limits, application_name="dispatcher-admin") as conn:
            return _read(conn, queue, limits)
    return _read(target, queue, limits)


def _read(
    conn: psycopg.Connection[Any], queue: str | None, limits: ConnectionLimits
) -> list[ScheduleRow]:
    with bounded_transaction(conn, "schedules list", limits):
        found = conn.execute(query("schedules_list"), {"queue": queue}, prepare=False)
        return rows.typed(ScheduleRow, found)
