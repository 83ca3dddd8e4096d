"""The store port: what a job's life needs of a job store, as a `typing.Protocol`.

The real store (dispatcher/db/store.py, `JobStore`, on PostgreSQL) and the in-memory one
(dispatcher/testing/, for users' unit tests) both satisfy it; tests/contract/test_store_contract.py
holds both to the same assertions. Writes by a job's owner are fenced by the claim's token: a
write that carries another token changes nothing. Time is the store's clock (the database's).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from dispatcher.db.progress import ProgressReport, ProgressWritten
from dispatcher.db.rows import (
    Claimed,
    Completion,
    ExpiredLease,
    FailedWrite,
    Failure,
    JobEnd,
    JobState,
    ResultText,
    Steal,
)
from dispatcher.model import Job

# JobState lives with the other typed rows (rows.py); it is part of the port's face too.
__all__ = ["GraphJob", "InProcessStore", "JobState", "JobStorePort", "NewJob"]


class NewJob(Protocol):
    """A job to insert, already validated and serialised by enqueue (dispatcher/api/enqueue.py)."""

    queue: str
    job_type: str
    payload: bytes  # JSON
    priority: int
    bucket: int
    max_attempts: int | None  # None: not given; the handler's max_attempts applies, else 20
    run_at: datetime | None  # None: the store's now, plus delay_s
    delay_s: float
    dedupe_key: str | None
    ordering_key: str | None
    dedupe_window_s: float | None  # a uniqueness window (dispatcher/api/enqueue_windows.py)
    tags: tuple[str, ...] | None  # checked, without duplicates; None: no tags (a NULL column)


@dataclass(frozen=True, slots=True)
class GraphJob:
    """One job of a graph (dispatcher/db/dependencies.py inserts it): `parents` are positions of
    earlier jobs of the same graph, `external` the ids of jobs that exist already; `batch`: the
    position of its batch's callback (the callback's own position for the callback)."""

    job: NewJob
    parents: tuple[int, ...] = ()
    external: tuple[int, ...] = ()
    on_parent_failure: str = "cancel"
    batch: int | None = None


@runtime_checkable
class JobStorePort(Protocol):
    """Every operation of a job's life: enqueue, claim, finish (fenced), lease upkeep, cancel,
    read."""

    worker_id: str

    async def jobs_enqueue(self, jobs: Sequence[NewJob]) -> list[int | None]:
        """Insert jobs; each one's id, or None where a live job of its queue holds its dedupe
        key."""
        ...

    async def jobs_claim(
        self,
        queue: str,
        limit: int,
        lease_s: float,
        buckets: Sequence[int] | None,
        steal: Steal | None = None,
        *,
        outside: Sequence[int] | None = None,
    ) -> Claimed:
        """Up to `limit` due jobs of `queue` in (priority, run_at, id) order, now running under one
        new token, their attempt counted and leased for `lease_s`; never one job to two claimers.
        A steal takes from the tail of each of its buckets in turn (rows.Steal). With the jobs,
        how many the selection found (more than claimed: others took some meanwhile).
        `outside`: `buckets` are a claim window, these the claimer's other buckets: if one of them
        has a due job of strictly better priority than the worst the window's claim would take,
        it takes nothing and says so (`outranked`; ignored on a Citus cluster)."""
        ...

    async def jobs_complete(
        self,
        ids: Sequence[int],
        tokens: Sequence[str],
        *,
        keyed: bool = False,
        buckets: Sequence[int] | None = None,
        results: Sequence[ResultText] | None = None,
    ) -> Completion:
        """Completed where the token still matches: how many were, and the ids refused (fenced).
        Each completed job with an ordering key releases its key: the key's next job becomes
        runnable (`keyed`: some may). `buckets`: each job's, which a distributed table routes by.
        `results`: each job's return value, stored with it (its row is then kept, whatever
        DISPATCHER_COMPLETED_JOBS says). Each completed job that has dependents releases its
        children (the last parent of a child to complete makes it runnable)."""
        ...

    async def jobs_fail_owned(
        self, failures: Sequence[Failure], *, lease_expired: bool = False
    ) -> list[FailedWrite]:
        """Each failure's outcome (retry after its delay, failed, discarded, cancelled) where the
        token still matches (and, with `lease_expired`, the lease is still expired); the rows
        written. A keyed job's key is released unless it is retried, or it ended failed or
        discarded and its Failure `halts`. A Failure's `snooze` within its cap queues the job
        again after the snooze, its attempt given back (FailedWrite.snoozed); past the cap its
        outcome is written."""
        ...

    async def jobs_release_owned(self, jobs: Sequence[Job]) -> int:
        """Claimed jobs given back unstarted: queued again, the attempt not counted."""
        ...

    async def jobs_extend_leases(self, jobs: Sequence[Job], lease_s: float) -> dict[int, bool]:
        """Leases of jobs still ours pushed out; their ids, each with whether a cancel was
        requested."""
        ...

    async def jobs_report_progress(
        self, reports: Sequence[ProgressReport]
    ) -> list[ProgressWritten]:
        """Running jobs' latest progress (replaced) and meta updates (merged key by key), where the
        job still runs under the report's token; the rows written (db/progress.py)."""
        ...

    async def jobs_lease_expired(self, limit: int = 1000) -> list[ExpiredLease]:
        """Running jobs whose lease ran out, oldest expiry first (the reaper fails them, fenced)."""
        ...

    async def jobs_cancel(self, ids: Sequence[int]) -> dict[int, str]:
        """Cancel jobs: a queued one ends 'cancelled' now, a running one gets a request its owner
        sees at its next lease extension. The ids changed, each with its status after ('cancelled'
        or 'running'); a finished or unknown job is left alone and absent."""
        ...

    async def job_get(self, job_id: int) -> JobState | None:
        """The job as it is now; None if there is no such job."""
        ...


class InProcessStore(abc.ABC):
    """A store in this process that `dispatcher.enqueue*` accepts in place of a connection or pool
    (dispatcher.testing.MemoryStore): the same checks run, then `insert_jobs` instead of SQL. A
    base class, not a Protocol, so that enqueue's check is one cheap isinstance()."""

    @abc.abstractmethod
    def insert_jobs(self, jobs: Sequence[NewJob]) -> list[int | None]:
        """Insert jobs at once, all or none; each one's id, or None where its dedupe key is held."""

    @abc.abstractmethod
    def job_end(self, job_id: int) -> JobEnd | None:
        """The job's status, result and last error now (JobHandle.result); None: no such job."""

    @abc.abstractmethod
    def insert_graph(self, graph: Sequence[GraphJob]) -> list[int]:
        """Insert a graph of jobs that depend on each other or on existing jobs
        (dispatcher/db/dependencies.py), all or none; each one's id, in graph order."""
