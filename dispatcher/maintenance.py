"""Maintenance: small periodic services beside the job path, each with one job.

- `LeaseKeeper`: extends the leases of this worker's running jobs (the heartbeat).
- `Reaper`: jobs whose lease ran out (their worker died or stalled) go through the retry policy
  like any other failed attempt: rescheduled with backoff, or `failed` after max_attempts.
- `Pruner`: deletes finished rows past their retention.
- `PlannerStats`: refreshes planner statistics when they fall far behind the table.
- `PressureSampler`: what the queue costs the database, as gauges.

Each runs `tick()` every jittered interval (N pods must not fire in lockstep); a store error is
counted and logged, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from . import metrics
from .backoff import jittered
from .constants import STATUS_QUEUED
from .errors import StoreError
from .executor import Executor
from .retry import FailureKind, RetryPolicy, lease_expired_error
from .store import Failure, HistoryRows, JobStore

log = logging.getLogger(__name__)

_LOGGED_PER_TICK = 20  # reaped jobs logged one by one per tick; the rest as a count


class PeriodicService:
    name = "maintenance"

    def __init__(self, store: JobStore, interval_s: float, *, first_delay_s: float | None = None) -> None:
        self._store = store
        self.interval_s = interval_s
        self._first_delay_s = first_delay_s

    async def run(self) -> None:
        await asyncio.sleep(jittered(self.interval_s) if self._first_delay_s is None else self._first_delay_s)
        while True:
            try:
                next_s = await self.tick()
            except StoreError as exc:
                metrics.STORE_ERRORS.labels(self.name).inc()
                log.warning("%s failed: %s", self.name, exc)
                next_s = None
            await asyncio.sleep(jittered(self.interval_s) if next_s is None else next_s)

    async def tick(self) -> float | None:
        """One round; returns the delay before the next one (None: the jittered interval)."""
        raise NotImplementedError


class LeaseKeeper(PeriodicService):
    name = "heartbeat"

    def __init__(self, store: JobStore, executor: Executor, *, lease_s: float, interval_s: float) -> None:
        super().__init__(store, interval_s)
        self._executor = executor
        self._lease_s = lease_s
        self.leases_lost = 0

    async def tick(self) -> None:
        # Only jobs held longer than one interval: a job claimed since the last beat still has at
        # least lease_s - interval >= 2 intervals of lease left (config: lease_s >= 2 x interval).
        due = self._executor.running_since(time.monotonic() - self.interval_s)
        if not due:
            return
        kept = await self._store.jobs_extend_leases(due, self._lease_s)
        # A job that finished while the statement ran was not extended either, and is not lost.
        lost = [j.id for j in due if j.id not in kept and self._executor.holds(j.id)]
        if lost:
            self.leases_lost += len(lost)
            metrics.LEASES_LOST.inc(len(lost))
            log.warning("lost the lease of %d running jobs (taken over): %s", len(lost), lost[:_LOGGED_PER_TICK])


class Reaper(PeriodicService):
    name = "reap"

    def __init__(self, store: JobStore, policy: RetryPolicy, *, interval_s: float, history: bool,
                 on_reaped: Callable[[], None]) -> None:
        super().__init__(store, interval_s)
        self._policy = policy
        self._history = history
        self._on_reaped = on_reaped
        self.reaped = 0

    async def tick(self) -> None:
        expired = await self._store.jobs_lease_expired()
        if not expired:
            return
        failures = [
            Failure(e.id, e.token, self._policy.decide(
                FailureKind.LEASE_EXPIRED, e.attempts, e.max_attempts,
                lease_expired_error(e.lease_expiries, e.locked_by, e.locked_at)))
            for e in expired
        ]
        # Fenced by token and re-checked for expiry: a reaper in another pod, or an owner whose
        # heartbeat landed meanwhile, wins and the row is left alone.
        written = await self._store.jobs_fail_owned(failures, lease_expired=True)
        if not written:
            return
        errors = {f.id: f.outcome.error for f in failures}
        if self._history:
            rows = HistoryRows()
            for w in written:
                rows.add(w.id, w.attempts, w.locked_by or "?", w.locked_at, None,
                         "retried" if w.status == STATUS_QUEUED else "failed", errors[w.id])
            await self._store.history_record(rows)
        self.reaped += len(written)
        metrics.JOBS_REAPED.inc(len(written))
        for w in written[:_LOGGED_PER_TICK]:
            log.warning("reaped job %d (attempt %d) -> %s: %s", w.id, w.attempts, w.status, errors[w.id])
        if len(written) > _LOGGED_PER_TICK:
            log.warning("... and %d more expired leases", len(written) - _LOGGED_PER_TICK)
        self._on_reaped()


class Pruner(PeriodicService):
    name = "prune"
    BATCH = 5000  # rows per statement: a short transaction, whatever the backlog of finished rows

    def __init__(self, store: JobStore, *, retention_s: float, interval_s: float) -> None:
        # First prune after a random fraction of the interval, so N pods started together spread out.
        super().__init__(store, interval_s, first_delay_s=interval_s * random.random())
        self._retention_s = retention_s

    async def tick(self) -> float | None:
        pruned = await self._store.jobs_prune_finished(self._retention_s, self.BATCH)
        metrics.JOBS_PRUNED.inc(pruned)
        # A full batch means more is waiting: go again soon rather than a whole interval later.
        return 0.5 if pruned >= self.BATCH else None


class PlannerStats(PeriodicService):
    name = "analyze"

    async def tick(self) -> None:
        await self._store.jobs_analyze_if_stale()


class PressureSampler(PeriodicService):
    name = "db_pressure"

    async def tick(self) -> None:
        p = await self._store.db_pressure()
        if p is None:
            return
        metrics.DB_DEAD_TUPLES.set(p.n_dead_tup)
        metrics.DB_LIVE_TUPLES.set(p.n_live_tup)
        metrics.DB_CLAIM_INDEX_TUPLES_READ.set(p.claim_idx_tup_read)
        metrics.DB_LOCK_WAITS.set(p.lock_waits)
