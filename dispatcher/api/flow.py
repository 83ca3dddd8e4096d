"""Flow control for the whole fleet: limits per job type and queue, paused queues. The API under
`dispatcher limits` and `dispatcher queues` (also in `dispatcher.admin`).

Kept in the database (migrations/0009_flow_control.sql), so every worker agrees and a change needs
no deploy: each change bumps the tables' version in the same transaction, and from its commit on no
claim made with an older copy takes a job. Sync psycopg, on a DSN or on your idle connection, each
call one short bounded transaction (db/oneshot.py). Semantics: docs/concepts/flow-control.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.job_filters import check_name
from dispatcher.constants import LIMIT_ANY, NOTIFY_CHANNEL
from dispatcher.db import rows
from dispatcher.db.oneshot import bounded_transaction, session
from dispatcher.db.queries import query
from dispatcher.errors import AdminInputError

ANY = LIMIT_ANY
MAX_RUNNING_MAX = 1_000_000
PER_SECOND_MAX = 1_000_000.0

Target = str | psycopg.Connection[Any]  # a DSN, or an idle connection of yours


@dataclass(frozen=True, slots=True)
class LimitRow:
    """A limit as `dispatcher limits list` shows it: with the jobs running under it now and, for a
    rate, the tokens (jobs that may start at once) it holds now."""

    job_type: str
    queue: str
    max_running: int | None
    per_second: float | None
    burst_jobs: float
    running: int
    tokens: float | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PausedQueue:
    queue: str
    paused_at: datetime


def set_limit(
    target: Target,
    job_type: str,
    *,
    queue: str | None = None,
    max_running: int | None = None,
    per_second: float | None = None,
    burst_jobs: float | None = None,
    limits: ConnectionLimits | None = None,
) -> LimitRow:
    """Set (or replace) the limit on `job_type` ('*': every type) in `queue` (None: every queue).

    `max_running`: at no instant do more than this many such jobs run across the fleet (0 holds them
    all back). `per_second`: the fleet starts at most this many a second, after a burst of up to
    `burst_jobs` (default: one second's worth, at least 1) when the rate's tokens are full.
    What was set before on the same (job_type, queue) is replaced, both values."""
    job_type, queue_name = (
        _name(job_type, "job_type", any_ok=True),
        ANY if queue is None else _name(queue, "queue", any_ok=True),
    )
    if max_running is None and per_second is None:
        raise AdminInputError("give max_running, per_second or both", "max_running")
    if max_running is not None and (
        isinstance(max_running, bool)
        or not isinstance(max_running, int)
        or not 0 <= max_running <= MAX_RUNNING_MAX
    ):
        raise AdminInputError(
            f"max_running must be a whole number in 0..{MAX_RUNNING_MAX}, got {max_running!r}",
            "max_running",
        )
    if per_second is not None:
        per_second = _number(per_second, "per_second", PER_SECOND_MAX)
        if per_second <= 0:
            raise AdminInputError(f"per_second must be > 0, got {per_second!r}", "per_second")
    if burst_jobs is not None:
        if per_second is None:
            raise AdminInputError("burst_jobs applies to a per_second limit only", "burst_jobs")
        burst_jobs = _number(burst_jobs, "burst_jobs", PER_SECOND_MAX)
        if burst_jobs < 1:
            raise AdminInputError(f"burst_jobs must be >= 1, got {burst_jobs!r}", "burst_jobs")
    burst = burst_jobs if burst_jobs is not None else max(1.0, per_second or 1.0)
    params = {
        "job_type": job_type,
        "queue": queue_name,
        "max_running": max_running,
        "per_second": per_second,
        "burst_jobs": burst,
    }
    with _transaction(target, "limits set", limits) as conn:
        conn.execute(query("flow_limit_set"), params, prepare=False)
    return next(
        r
        for r in list_limits(target, limits=limits)
        if (r.job_type, r.queue) == (job_type, queue_name)
    )


def clear_limits(
    target: Target,
    job_type: str | None = None,
    *,
    queue: str | None = None,
    limits: ConnectionLimits | None = None,
) -> list[tuple[str, str]]:
    """Remove the limits on `job_type` (None: on every type) in `queue` (None: in every queue, the
    '*' limit included); returns the (job_type, queue) pairs removed. Both None removes them all."""
    params = {
        "job_type": None if job_type is None else _name(job_type, "job_type", any_ok=True),
        "queue": None if queue is None else _name(queue, "queue", any_ok=True),
    }
    with _transaction(target, "limits clear", limits) as conn:
        cur = conn.execute(query("flow_limit_clear"), params, prepare=False)
        return list(rows.typed(rows.LimitKey, cur))


def list_limits(target: Target, *, limits: ConnectionLimits | None = None) -> list[LimitRow]:
    with _transaction(target, "limits list", limits) as conn:
        return rows.typed(LimitRow, conn.execute(query("flow_limits_list"), prepare=False))


def pause_queue(target: Target, queue: str, *, limits: ConnectionLimits | None = None) -> bool:
    """Pause `queue`: from the commit on, no worker claims its jobs; running ones finish, enqueueing
    goes on. Returns False if it was paused already."""
    params = {"queue": _name(queue, "queue")}  # checked before connecting
    with _transaction(target, "queues pause", limits) as conn:
        row = conn.execute(query("flow_queue_pause"), params, prepare=False).fetchone()
    return bool(rows.value(row))


def resume_queue(target: Target, queue: str, *, limits: ConnectionLimits | None = None) -> bool:
    """Resume `queue` and wake its workers. Returns False if it was not paused."""
    params = {"queue": _name(queue, "queue"), "channel": NOTIFY_CHANNEL}
    with _transaction(target, "queues resume", limits) as conn:
        row = conn.execute(query("flow_queue_resume"), params, prepare=False).fetchone()
    return bool(rows.value(row))


def paused_queues(target: Target, *, limits: ConnectionLimits | None = None) -> list[PausedQueue]:
    with _transaction(target, "queues list", limits) as conn:
        return rows.typed(PausedQueue, conn.execute(query("flow_paused_list"), prepare=False))


def _name(value: Any, option: str, *, any_ok: bool = False) -> str:
    """A queue name or job type as enqueue accepts them, or (`any_ok`, a limit's) '*': every
    one. AdminInputError naming `option` else."""
    if any_ok and value == ANY:
        return ANY
    return check_name(value, option)


def _number(value: Any, option: str, most: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value > most
    ):
        raise AdminInputError(
            f"{option} must be a finite number <= {most:g}, got {value!r}", option
        )
    return float(value)


@contextlib.contextmanager
def _transaction(
    target: Target, what: str, limits: ConnectionLimits | None
) -> Iterator[psycopg.Connection[Any]]:
    limits = limits or ConnectionLimits()
    if isinstance(target, str):
        with (
            session(target, limits, application_name="dispatcher-admin") as conn,
            bounded_transaction(conn, what, limits),
        ):
            yield conn
        return
    if target.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise AdminInputError(
            "flow-control changes commit at once: pass a connection that is not inside a "
            "transaction",
            "conn",
        )
    with bounded_transaction(target, what, limits):
        yield target
