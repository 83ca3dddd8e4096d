"""What the operator's API (dispatcher.admin, which re-exports them) returns: the typed rows of a
list, a search and a job's page, and what a retry, cancel or purge did."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    queue: str
    job_type: str
    status: str
    priority: int
    attempts: int
    max_attempts: int | None  # None: not given at enqueue (the handler's, else 20)
    run_at: datetime
    created_at: datetime
    updated_at: datetime  # when it entered its status
    age_s: float  # since then, by the database's clock
    locked_by: str | None
    cancel_requested_at: datetime | None
    last_error: str | None
    tags: list[str] | None = None  # given at enqueue (None: none)


@dataclass(frozen=True, slots=True)
class HaltedKey:
    """An ordering key that a failed or discarded job halts, and how many jobs wait behind it."""

    queue: str
    ordering_key: str
    job_id: int
    job_type: str
    status: str
    failed_at: datetime | None
    last_error: str | None
    waiting: int


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    outcome: str
    error: str | None


@dataclass(frozen=True, slots=True)
class JobDetail:
    """`show`: the whole row (as a dict of its columns), its last error, its attempt history."""

    job: dict[str, Any]
    last_error: str | None
    attempts: list[Attempt]


@dataclass(frozen=True, slots=True)
class Skipped:
    id: int
    status: str | None  # when the statement began (None: no such job)
    reason: str


@dataclass(slots=True)
class AdminResult:
    """What a retry, cancel or purge did. `changed`: retried / cancelled at once / purged; for a
    cancel, `requested`: running jobs that got a cancel request. Ids beyond MAX_REPORTED_IDS are
    counted, not listed."""

    action: str
    matched: int = 0  # jobs considered: the ids given, or those the filters matched
    changed_count: int = 0
    requested_count: int = 0
    changed: list[int] = field(default_factory=list)
    requested: list[int] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    finished: bool = True  # False: told to stop between batches (keep_going); the rest still match


@dataclass(frozen=True, slots=True)
class Match:
    """What a bulk change would touch: how many jobs, the newest of them, and when (the database's
    clock): `Filters(as_of=...)` and `up_to_id` hold a later change to exactly these."""

    count: int
    newest_id: int | None
    as_of: datetime


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of search_jobs: the jobs that match among the ids from `floor` up to `ceiling`
    (excluded), newest first; `older`: the table holds jobs below the floor (the next window)."""

    jobs: list[JobRow]
    floor: int
    ceiling: int
    older: bool
