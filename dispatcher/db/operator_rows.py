"""The typed rows of the operator's reads (dispatcher status, the dashboard, the admin API), off the
worker's path; dispatcher/db/rows.py re-exports them beside the worker's rows."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple


class LimitKey(NamedTuple):
    """flow_limit_clear: a limit removed."""

    job_type: str
    queue: str


class RunSpans(NamedTuple):
    """measure_spans (the demo's): seconds to the first claim and to the last completion."""

    first_claim_s: float | None
    last_completion_s: float | None


class StatusCount(NamedTuple):
    """status_counts: the jobs of one queue in one status."""

    queue: str
    status: str
    jobs: int


class LeaderRow(NamedTuple):
    """status_leaders: a coordination group's leader now."""

    group: str
    leader: str
    term: int


class MemberRow(NamedTuple):
    """status_members: a live member of a coordination group (ages in seconds)."""

    group: str
    member: str
    heartbeat_age_s: float
    up_s: float
    leaving: bool
    leads: bool


class BucketOwnerRow(NamedTuple):
    """status_bucket_owners: a bucket's owner, and the member it is being handed to."""

    group: str
    bucket: int
    owner: str | None
    next_owner: str | None


class RecentOutcomes(NamedTuple):
    """web_recent_outcomes: a queue's jobs completed, and failed (or discarded, cancelled),
    lately."""

    queue: str
    completed: int
    failed: int


class JobsMatch(NamedTuple):
    """admin_jobs_count: how many jobs match, the newest one's id, and the instant."""

    matched: int
    newest: int | None
    as_of: datetime


class JobIdRange(NamedTuple):
    """admin_jobs_id_range: the lowest and the highest id of the jobs table (None: empty)."""

    lowest: int | None
    newest: int | None
