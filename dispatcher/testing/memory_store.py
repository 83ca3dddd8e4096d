"""An in-memory job store for unit tests: the store port (dispatcher/db/port.py) without PostgreSQL.

It keeps the rules of the real store's statements (dispatcher/db/sql/*.sql) that a test can
observe: claims in (priority, run_at, id) order, one token per claim, writes fenced by that
token, a retry of a job with a cancel request ending 'cancelled', dedupe keys unique among live
jobs of a queue (and held for `dedupe_window_s` after a job finished, testing/windows.py), and
ordering keys: one holder per key, its later jobs waiting, the next promoted when the holder ends
(or never, while a failure halts the key, until `retry` or `cancel` of the failed job). Its
database clock is a `FakeClock`. tests/contract/test_store_contract.py holds it and the real
store to the same assertions. `dispatcher.enqueue*` accept it in place of a connection.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import orjson

from dispatcher.constants import COMPLETED_DELETE, COMPLETED_JOBS, COMPLETED_KEEP, NUM_BUCKETS
from dispatcher.db.dependencies import GraphJob
from dispatcher.db.port import InProcessStore, NewJob
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
from dispatcher.model import (
    STATUS_BLOCKED,
    STATUS_CANCELLED,
    STATUS_COMPLETED,
    STATUS_DISCARDED,
    STATUS_FAILED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    STATUS_WAITING,
    Job,
)
from dispatcher.testing.clock import FakeClock
from dispatcher.testing.memory_deps import MemoryDeps
from dispatcher.testing.memory_failures import write_failures
from dispatcher.testing.progress import ProgressInMemory
from dispatcher.testing.stealing import stealable
from dispatcher.testing.windows import DedupeWindows

_LIVE = (STATUS_QUEUED, STATUS_RUNNING, STATUS_WAITING, STATUS_BLOCKED)
_HOLDING = (STATUS_QUEUED, STATUS_RUNNING)  # with ordering_halted: a key's holder (migration 0008)


class MemoryStore(InProcessStore, ProgressInMemory):
    """The job store in a dict. Thread-safe (sync handlers run in threads, as in a worker).

    `clock` is its database clock (default: a new FakeClock at the real time now); `worker_id`
    is what claims record as the owner; `completed_jobs` is DISPATCHER_COMPLETED_JOBS: 'keep'
    (a completed job stays, status 'completed') or 'delete' (a completion removes the job)."""

    def __init__(
        self,
        clock: FakeClock | None = None,
        *,
        worker_id: str = "memory",
        completed_jobs: str = COMPLETED_KEEP,
    ) -> None:
        if completed_jobs not in COMPLETED_JOBS:
            raise ValueError(
                f"completed_jobs must be one of {', '.join(COMPLETED_JOBS)}, got {completed_jobs!r}"
            )
        self.clock = clock or FakeClock()
        self.worker_id = worker_id
        self.completed_jobs = completed_jobs
        # Rows are JobStates holding the payload as enqueue serialised it (JSON bytes), replaced on
        # every write; the tokens of running jobs' claims are kept beside them.
        self._rows: dict[int, JobState] = {}
        self._tokens: dict[int, str] = {}
        self._next_id = 1
        self._lock = threading.RLock()
        self._windows = DedupeWindows()
        self._deps = MemoryDeps()  # dependencies between jobs (memory_deps.py)

    # -- enqueue -------------------------------------------------------------------------------

    def insert_jobs(self, jobs: Sequence[NewJob]) -> list[int | None]:
        with self._lock:
            now = self.clock.now()
            ids: list[int | None] = [None] * len(jobs)
            for n in self._insert_order(jobs, now):
                job = jobs[n]
                window_s = getattr(job, "dedupe_window_s", None)
                if self._windows.refuses(job, self._rows, now):
                    continue
                run_at = (job.run_at or now) + timedelta(seconds=job.delay_s)
                key = getattr(job, "ordering_key", None)
                status = STATUS_QUEUED
                if key is not None and (
                    self._holder(job.queue, key) is not None
                    or any(
                        r.status == STATUS_WAITING
                        and r.queue == job.queue
                        and r.ordering_key == key
                        for r in self._rows.values()
                    )
                ):
                    status = STATUS_WAITING  # jobs_insert_one_keyed: behind its key's earlier jobs
                row = JobState(
                    self._next_id,
                    job.queue,
                    job.job_type,
                    status,
                    job.priority,
                    job.bucket,
                    0,
                    job.max_attempts,
                    0,
                    run_at,
                    now,
                    now,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    job.dedupe_key,
                    bytes(job.payload),
                    None,
                    key,
                    tags=None if job.tags is None else list(job.tags),
                )
                self._rows[row.id] = row
                self._next_id += 1
                ids[n] = row.id
                if window_s is not None and job.dedupe_key is not None:
                    self._windows.open(job.queue, job.dedupe_key, row.id, window_s, now)
            return ids

    def job_end(self, job_id: int) -> JobEnd | None:
        row = self.get(job_id)
        return None if row is None else JobEnd(row.status, row.result, row.last_error)

    def insert_graph(self, graph: Sequence[GraphJob]) -> list[int]:
        with self._lock:
            return self._deps.insert_graph(self, graph)

    def _insert_order(self, jobs: Sequence[NewJob], now: datetime) -> list[int]:
        """The batch's positions in the order its jobs get their ids. With ordering keys, as
        jobs_stage_publish_keyed numbers them: first each key's first job that becomes its holder
        (the key has none and nothing waits for it), then the rest, each part in batch order. A
        job with a window after another job of its dedupe key is never a holder: it is refused
        (dedupe_stage_refuse), as it is one by one."""
        if len(jobs) < 2 or all(getattr(job, "ordering_key", None) is None for job in jobs):
            return list(range(len(jobs)))
        heads: dict[tuple[str, str], int] = {}
        seen: set[tuple[str, str | None]] = set()
        for n, job in enumerate(jobs):
            refused = self._windows.refuses(job, self._rows, now, seen)
            seen.add((job.queue, job.dedupe_key))
            if job.ordering_key is None:
                continue
            key = (job.queue, job.ordering_key)
            if key in heads or refused:
                continue
            heads[key] = n
        heads = {
            key: n
            for key, n in heads.items()
            if self._holder(*key) is None
            and not any(
                r.status == STATUS_WAITING and (r.queue, r.ordering_key) == key
                for r in self._rows.values()
            )
        }
        first = sorted(heads.values())
        return first + [n for n in range(len(jobs)) if n not in heads.values()]

    async def jobs_enqueue(self, jobs: Sequence[NewJob]) -> list[int | None]:
        return self.insert_jobs(jobs)

    # -- claim ---------------------------------------------------------------------------------

    def claim(
        self,
        queue: str,
        limit: int,
        lease_s: float,
        buckets: Sequence[int] | None = None,
        steal: Steal | None = None,
        outside: Sequence[int] | None = None,
    ) -> Claimed:
        """The port's jobs_claim, callable without an event loop."""
        if buckets is not None and steal is None:
            if not buckets:
                raise ValueError("a partitioned claim needs at least one bucket")
            if any(not isinstance(b, int) or not 0 <= b < NUM_BUCKETS for b in buckets):
                raise ValueError(
                    f"buckets must be integers in 0..{NUM_BUCKETS - 1}: {list(buckets)}"
                )
        with self._lock:
            now = self.clock.now()
            due = [
                r
                for r in self._rows.values()
                if r.queue == queue and r.status == STATUS_QUEUED and r.run_at <= now
            ]
            # E731: the sort key is one expression, chosen here beside its alternatives
            order: Callable[[JobState], tuple[Any, ...]] = lambda r: (r.priority, r.run_at, r.id)  # noqa: E731
            beyond: list[int] = []  # the priorities due in `outside`: a claim window's veto
            if steal is not None:  # the given buckets in the given order, each from its tail
                due = stealable(due, steal)
                order = lambda r: ()  # noqa: E731  (already in steal order; sorted() is stable)
            elif buckets is not None:
                wanted, others = set(buckets), set(outside or ())
                beyond = [r.priority for r in due if r.bucket in others]
                due = [r for r in due if r.bucket in wanted]
            picked = sorted(due, key=order)[: max(limit, 0)]
            if picked and min(beyond, default=picked[-1].priority) < picked[-1].priority:
                return Claimed([], 0, outranked=True)  # (in order: the last is the worst)
            token = str(uuid.uuid4())
            lease_until = now + timedelta(seconds=lease_s)
            claimed = []
            for row in picked:
                row = self._write(
                    row,
                    token=token,
                    status=STATUS_RUNNING,
                    attempts=row.attempts + 1,
                    locked_at=now,
                    locked_by=self.worker_id,
                    lease_expires_at=lease_until,
                    updated_at=now,
                )
                claimed.append(
                    Job(
                        id=row.id,
                        job_type=row.job_type,
                        payload=orjson.loads(row.payload),
                        attempts=row.attempts,
                        max_attempts=row.max_attempts,
                        locked_at=row.locked_at,
                        bucket=row.bucket,
                        priority=row.priority,
                        ordering_key=row.ordering_key,
                        token=token,
                        queue=queue,
                    )
                )
            # `selected`: what the claim found, all of it claimed (nobody else claims meanwhile)
            return Claimed(claimed, len(claimed))

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
        return self.claim(queue, limit, lease_s, buckets, steal, outside)

    def _owned(self, job_id: int, token: str) -> JobState | None:
        """The row if it is running under `token` (the fence of every owner's write)."""
        row = self._rows.get(job_id)
        return (
            row
            if row is not None
            and row.status == STATUS_RUNNING
            and self._tokens.get(job_id) == token
            else None
        )

    def _holder(self, queue: str, key: str) -> JobState | None:
        return next(
            (
                r
                for r in self._rows.values()
                if r.queue == queue
                and r.ordering_key == key
                and (r.status in _HOLDING or r.ordering_halted)
            ),
            None,
        )

    def _release(self, row: JobState) -> None:
        """`row` no longer holds its key: the key's next waiting job becomes queued
        (ordering_promote_next). It ended: its children are released (memory_deps.py)."""
        self._deps.ended(self, row.id)
        if row.ordering_key is None or self._holder(row.queue, row.ordering_key) is not None:
            return
        waiting = [
            r
            for r in self._rows.values()
            if r.queue == row.queue
            and r.ordering_key == row.ordering_key
            and r.status == STATUS_WAITING
        ]
        if waiting:
            nxt = min(waiting, key=lambda r: r.id)
            self._write(nxt, status=STATUS_QUEUED, updated_at=self.clock.now())

    def _write(self, row: JobState, token: str | None = None, **changes: Any) -> JobState:
        """The row with `changes`; `token`: the claim's that now owns it (None: nobody's)."""
        new = self._rows[row.id] = replace(row, **changes)
        if token is None:
            self._tokens.pop(row.id, None)
        else:
            self._tokens[row.id] = token
        return new

    # -- finishing -----------------------------------------------------------------------------

    def complete(
        self,
        ids: Sequence[int],
        tokens: Sequence[str],
        results: Sequence[ResultText] | None = None,
    ) -> Completion:
        """The port's jobs_complete, callable without an event loop: complete where the token
        matches; how many were, and the ids refused (jobs_complete_owned_fenced). A job with a
        result (jobs_results_write) keeps its row, whatever completed_jobs says."""
        with self._lock:
            now, fenced, delete = self.clock.now(), [], self.completed_jobs == COMPLETED_DELETE
            for n, (job_id, token) in enumerate(zip(ids, tokens, strict=True)):
                if (row := self._owned(job_id, token)) is None:
                    fenced.append(job_id)
                    continue
                if results is not None:
                    text, error = results[n]
                    row = self._write(
                        row,
                        self._tokens[job_id],
                        result=None if text is None else orjson.loads(text),
                        last_error=error or row.last_error,
                    )
                if delete and results is None:  # jobs_complete_owned_delete: the row goes
                    del self._rows[job_id]
                    self._tokens.pop(job_id, None)
                    self._windows.deleted(row, now)  # jobs_complete_owned_delete_fenced
                else:
                    self._write(
                        row,
                        status=STATUS_COMPLETED,
                        completed_at=now,
                        lease_expires_at=None,
                        updated_at=now,
                    )
                self._release(row)
            return Completion(len(ids) - len(fenced), fenced)

    async def jobs_complete(
        self,
        ids: Sequence[int],
        tokens: Sequence[str],
        *,
        keyed: bool = False,
        buckets: object = None,
        results: Sequence[ResultText] | None = None,
    ) -> Completion:
        # Keys are released either way: `keyed` only spares the real store the keyed statement;
        # `buckets` only a distributed table needs.
        return self.complete(ids, tokens, results)

    def fail(
        self, failures: Sequence[Failure], *, lease_expired: bool = False
    ) -> list[FailedWrite]:
        with self._lock:
            return write_failures(self, failures, lease_expired)

    async def jobs_fail_owned(
        self, failures: Sequence[Failure], *, lease_expired: bool = False
    ) -> list[FailedWrite]:
        return self.fail(failures, lease_expired=lease_expired)

    async def jobs_release_owned(self, jobs: Sequence[Job]) -> int:
        with self._lock:
            now, released = self.clock.now(), 0
            for job in jobs:
                if (row := self._owned(job.id, job.token)) is not None:
                    row = self._write(
                        row,
                        status=STATUS_QUEUED
                        if row.cancel_requested_at is None
                        else STATUS_CANCELLED,
                        attempts=max(row.attempts - 1, 0),
                        lease_expires_at=None,
                        updated_at=now,
                    )
                    if row.status == STATUS_CANCELLED:
                        self._release(row)
                    released += 1
            return released

    # -- leases --------------------------------------------------------------------------------

    async def jobs_extend_leases(self, jobs: Sequence[Job], lease_s: float) -> dict[int, bool]:
        with self._lock:
            until, kept = self.clock.now() + timedelta(seconds=lease_s), {}
            for job in jobs:
                if (row := self._owned(job.id, job.token)) is not None:
                    self._write(row, job.token, lease_expires_at=until)
                    kept[row.id] = row.cancel_requested_at is not None
            return kept

    async def jobs_lease_expired(self, limit: int = 1000) -> list[ExpiredLease]:
        with self._lock:
            now = self.clock.now()
            expired = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status == STATUS_RUNNING
                    and r.lease_expires_at is not None
                    and r.lease_expires_at < now
                ),
                key=lambda r: r.lease_expires_at or now,
            )[:limit]
            return [
                ExpiredLease(
                    r.id,
                    self._tokens[r.id],
                    r.attempts,
                    r.max_attempts,
                    r.lease_expiries + 1,
                    r.locked_by,
                    r.locked_at,
                    r.cancel_requested_at is not None,
                    r.job_type,
                    r.ordering_key is not None,
                )
                for r in expired
            ]

    # -- operators and tests -------------------------------------------------------------------

    def cancel(self, ids: Sequence[int]) -> dict[int, str]:
        with self._lock:
            now, changed = self.clock.now(), {}
            for job_id in ids:
                row = self._rows.get(job_id)
                # a halted key's failed holder: the key goes on
                if row is not None and row.ordering_halted:
                    row = self._write(
                        row, status=STATUS_CANCELLED, ordering_halted=False, updated_at=now
                    )
                    self._release(row)
                    changed[row.id] = row.status
                    continue
                if row is None or row.status not in _LIVE:
                    continue
                requested_at = row.cancel_requested_at or now
                if row.status in (STATUS_QUEUED, STATUS_WAITING, STATUS_BLOCKED):
                    row = self._write(
                        row,
                        status=STATUS_CANCELLED,
                        cancel_requested_at=requested_at,
                        updated_at=now,
                    )
                    self._release(row)
                else:  # running: its owner sees the request when it next extends the lease
                    row = self._write(row, self._tokens[row.id], cancel_requested_at=requested_at)
                changed[row.id] = row.status
            return changed

    async def jobs_cancel(self, ids: Sequence[int]) -> dict[int, str]:
        return self.cancel(ids)

    def retry(self, ids: Sequence[int]) -> list[int]:
        """`dispatcher jobs retry --id`: failed or discarded jobs back to queued, due now, one
        more attempt allowed (a max_attempts not given stays so), snoozes from 0
        (admin_jobs_retry). A halted key's holder stays its holder, no longer halted; another
        keyed job goes back behind its key's holder, if the key has one. The ids changed."""
        with self._lock:
            now, changed = self.clock.now(), []
            for job_id in ids:
                row = self._rows.get(job_id)
                if (
                    row is None
                    or row.status not in (STATUS_FAILED, STATUS_DISCARDED)
                    or (
                        row.dedupe_key is not None
                        and any(
                            r.dedupe_key == row.dedupe_key
                            and r.queue == row.queue
                            and r.status in _LIVE
                            for r in self._rows.values()
                        )
                    )
                ):
                    continue
                behind = (
                    row.ordering_key is not None
                    and not row.ordering_halted
                    and self._holder(row.queue, row.ordering_key) is not None
                )
                self._write(
                    row,
                    status=STATUS_WAITING if behind else STATUS_QUEUED,
                    run_at=now,
                    max_attempts=None
                    if row.max_attempts is None
                    else max(row.max_attempts, row.attempts + 1),
                    snoozes=0,
                    failed_at=None,
                    cancel_requested_at=None,
                    ordering_halted=False,
                    updated_at=now,
                )
                changed.append(job_id)
            return changed

    def get(self, job_id: int) -> JobState | None:
        with self._lock:
            row = self._rows.get(job_id)
            return None if row is None else _copy(row)

    async def job_get(self, job_id: int) -> JobState | None:
        return self.get(job_id)

    def jobs(
        self, status: str | None = None, *, job_type: str | None = None, queue: str | None = None
    ) -> list[JobState]:
        """Every job (or those of a status, type, queue), in the order they were enqueued."""
        with self._lock:
            return [
                _copy(r)
                for r in self._rows.values()
                if (status is None or r.status == status)
                and (job_type is None or r.job_type == job_type)
                and (queue is None or r.queue == queue)
            ]

    def queues(self) -> set[str]:
        with self._lock:
            return {r.queue for r in self._rows.values()}

    def next_run_at(self, queue: str | None = None) -> datetime | None:
        """When the earliest queued job (of `queue`, or any) is due; None if none is queued."""
        with self._lock:
            times = [
                r.run_at
                for r in self._rows.values()
                if r.status == STATUS_QUEUED and (queue is None or r.queue == queue)
            ]
            return min(times, default=None)


def _copy(row: JobState) -> JobState:
    """The row as callers see it: the payload decoded afresh, so their edits never reach the
    store."""
    return replace(row, payload=orjson.loads(row.payload), tags=row.tags and [*row.tags])
