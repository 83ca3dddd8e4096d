"""Maintenance: small periodic services beside the job path, each with one job.

`LeaseKeeper` (heartbeats, and cancel requests), `Reaper` (expired leases through the retry
policy), `Pruner` (retention, one pod at a time: janitor.py) and `PlannerStats` (ANALYZE when
statistics fall far behind). Each ticks every jittered interval; errors are counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from dispatcher.backoff import HandlerRetry, jittered
from dispatcher.db.rows import Failure, HistoryRows
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError, StorePermissionDenied
from dispatcher.model import STATUS_QUEUED, FailureKind
from dispatcher.observe import metrics
from dispatcher.runtime import joblog
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.janitor import PRUNE_QUERIES, PruneRound, prune_round
from dispatcher.runtime.retry import RetryPolicy, lease_expired_error
from dispatcher.runtime.vitals import Vitals
from dispatcher.settings.sections import LeaseSettings, MaintenanceSettings, RetentionSettings

log = logging.getLogger(__name__)


class PeriodicService:
    name = "maintenance"

    def __init__(
        self,
        store: JobStore,
        interval_s: float,
        *,
        first_delay_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock  # the executor's, for the lease keeper: a test passes a fake one
        self.interval_s = interval_s
        self._first_delay_s = first_delay_s
        self.retired = False  # set by a service that can never work here: run() then returns
        # The clock's time of the first of the ticks failing now (a store error); the reaper
        # reports it in the vitals. (Not the lease keeper's: its ticks catch their own errors.)
        self.tick_failing_since: float | None = None

    async def run(self) -> None:
        await asyncio.sleep(
            jittered(self.interval_s) if self._first_delay_s is None else self._first_delay_s
        )
        while True:
            try:
                next_s = await self.tick()
                self.tick_failing_since = None
            except StoreError as exc:
                metrics.STORE_ERRORS.labels(self.name).inc()
                log.warning("%s failed: %s", self.name, exc)
                next_s = None
                if self.tick_failing_since is None:
                    self.tick_failing_since = self._clock()
            self._tick_failing(self.tick_failing_since)
            if self.retired:
                return
            await asyncio.sleep(jittered(self.interval_s) if next_s is None else next_s)

    async def tick(self) -> float | None:
        """One round; returns the delay before the next one (None: the jittered interval)."""
        raise NotImplementedError

    def _tick_failing(self, since: float | None) -> None:
        """After each tick: since when ticks fail (None: the last one worked)."""


class LeaseKeeper(PeriodicService):
    """Extends our running jobs' leases, and is how the worker learns that it cannot keep them.

    - A job the database no longer lets us extend was taken over: the executor drops it if it
      has not started, cancels it if async (a thread cannot be stopped; its outcome is fenced).
    - A job an operator asked to cancel (the heartbeat returns the request) is cancelled by the
      executor and ends 'cancelled'. Only jobs held longer than one interval get a heartbeat, so a
      request is seen within two intervals (+10% jitter, + a statement) of being made: 20-22 s
      at the default 30 s lease.
    - While heartbeats fail (database unreachable or stalled), `stalled` is true and the producer
      claims nothing: new jobs' leases could not be kept either. Jobs whose lease (as we last
      extended it) is about to run out meanwhile are lost (Executor: another worker may take
      them as soon as it ends). We probe every second until the database answers again.
    """

    name = "heartbeat"
    STALLED_PROBE_S = 1.0

    def __init__(
        self,
        store: JobStore,
        executor: Executor,
        leases: LeaseSettings,
        *,
        vitals: Vitals | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store, leases.heartbeat_s, clock=clock)
        self._executor = executor
        self._lease_s = leases.lease_s
        self._vitals = vitals if vitals is not None else Vitals()  # writes heartbeats_failing_since
        self.leases_lost = 0

    @property
    def stalled(self) -> bool:
        return self._vitals.stalled

    async def tick(self) -> float | None:
        # Only jobs held longer than one interval: a job claimed since the last beat still has at
        # least lease_s - interval >= 2 intervals of lease left (config: lease_s >= 2 x interval).
        sent_at = self._clock()
        due = self._executor.running_since(sent_at - self.interval_s)
        try:
            if due:
                # id -> cancel requested
                kept = await self._store.jobs_extend_leases(due, self._lease_s)
            elif self.stalled or self._executor.in_flight:
                # Nothing due yet, but jobs we hold will need their heartbeats: a round trip per
                # interval shows a stall within interval + statement timeout (15 s of the 30 s
                # lease at the defaults), not up to an interval later.
                await self._store.ping()
        except StoreError as exc:
            self._failing(exc)  # leases that run out meanwhile are lost by the executor's own timer
            return jittered(self.STALLED_PROBE_S)
        self._answered()
        if due:
            self._executor.extended(kept, sent_at + self._lease_s)
            # A job that finished while the statement ran was not extended either, and is not lost.
            lost = self._executor.lose(
                [j.id for j in due if j.id not in kept],
                "taken over: its lease had run out and another worker or a reaper got it",
            )
            if lost:
                self.leases_lost += lost
                metrics.LEASES_LOST.inc(lost)
            self._executor.cancel([job_id for job_id, cancel in kept.items() if cancel])
        return None

    def _failing(self, exc: StoreError) -> None:
        metrics.STORE_ERRORS.labels(self.name).inc()
        if self._vitals.heartbeats_failing_since is None:
            self._vitals.heartbeats_failing_since = self._clock()
            metrics.DB_STALLED.set(1)
            log.warning(
                "heartbeat failed (%s): claiming nothing until the database answers; running jobs "
                "keep going while their leases last",
                exc,
            )
        else:
            log.debug("heartbeat still failing: %s", exc)

    def _answered(self) -> None:
        since = self._vitals.heartbeats_failing_since
        if since is not None:
            log.warning(
                "the database answers heartbeats again after %.1f s: claiming again",
                self._clock() - since,
            )
            self._vitals.heartbeats_failing_since = None
            metrics.DB_STALLED.set(0)


class Reaper(PeriodicService):
    name = "reap"

    def __init__(
        self,
        store: JobStore,
        policy: RetryPolicy,
        settings: MaintenanceSettings,
        *,
        on_reaped: Callable[[], None],
        vitals: Vitals | None = None,
        halts: Callable[[str], bool] = lambda job_type: True,
        retry_of: Callable[[str], HandlerRetry | None] = lambda job_type: None,
    ) -> None:
        super().__init__(store, settings.reaper_interval_s)
        self._policy = policy
        self._halts = halts  # the registry's: whether a keyed job's final failure halts its key
        # the registry's: a handler's own retry settings (max_attempts, backoff)
        self._retry_of = retry_of
        self._history = settings.history
        self._on_reaped = on_reaped
        # Readiness reads the reaper's failures (reaper_failing_since): every pod runs it every
        # few seconds on its maintenance connection.
        self._vitals = vitals if vitals is not None else Vitals()
        self.reaped = 0

    def _tick_failing(self, since: float | None) -> None:
        self._vitals.reaper_failing_since = since

    async def tick(self) -> None:
        expired = await self._store.jobs_lease_expired()
        if not expired:
            return
        failures = [
            Failure(
                e.id,
                e.token,
                self._policy.decide(
                    FailureKind.CANCELLED if e.cancel_requested else FailureKind.LEASE_EXPIRED,
                    e.attempts,
                    e.max_attempts,
                    ("cancelled: an operator asked, and the job's " if e.cancel_requested else "")
                    + lease_expired_error(e.lease_expiries, e.locked_by, e.locked_at),
                    self._retry_of(e.job_type or ""),
                ),
                halts=not e.keyed or self._halts(e.job_type or ""),
            )
            for e in expired
        ]
        # Fenced by token and re-checked for expiry: a reaper in another pod, or an owner whose
        # heartbeat landed meanwhile, wins and the row is left alone.
        written = await self._store.jobs_fail_owned(failures, lease_expired=True)
        if not written:
            return
        joblog.reaped(written, failures, expired)  # once written, one line each with the old owner
        errors = {f.id: f.outcome.error for f in failures}
        if self._history:
            rows = HistoryRows()
            for w in written:
                rows.add(
                    w.id,
                    w.attempts,
                    w.locked_by or "?",
                    w.locked_at,
                    None,
                    "retried" if w.status == STATUS_QUEUED else w.status,
                    errors[w.id],
                )
            await self._store.history_record(rows)
        self.reaped += len(written)
        metrics.JOBS_REAPED.inc(len(written))
        self._on_reaped()


class Pruner(PeriodicService):
    """Deletes rows past their retention, by kind (PRUNE_QUERIES: completed jobs, failed ones,
    history rows; a kind whose retention is 0 is kept forever).

    One pod at a time: the pod holding the `janitor` maintenance lease (migration 0006, on the
    database's clock, LEASE_INTERVALS intervals long, renewed each round, given up at shutdown)
    prunes and exports the lag; the others skip their rounds and export no lag, so N pods do not
    export N copies. A round is also one transaction behind a try-lock: a pod whose lease ran out
    mid-round never prunes beside the next holder. In bounded batches:
    each DELETE takes at most `batch` rows (~2 ms per 1,000 at 500k rows), a round at most
    ROUND_STATEMENTS of them; while some kind has more waiting, the next round comes about
    CATCH_UP_S later instead of an interval later, so a backlog drains (up to ~12,000 rows a
    second at the default batch) without a long statement or transaction, and other pods get
    their turn in between."""

    name = "prune"
    ROUND_STATEMENTS = 6
    CATCH_UP_S = 0.5
    LEASE_NAME = "janitor"
    LEASE_INTERVALS = 3  # a holder may miss two rounds (a slow statement, a blip) and keep the role

    def __init__(self, store: JobStore, settings: RetentionSettings) -> None:
        # First prune after a random fraction of the interval, so N pods started together spread
        # out.
        super().__init__(
            store, settings.interval_s, first_delay_s=settings.interval_s * random.random()
        )
        self._retentions_s = {kind: r for kind, r in settings.retentions_s.items() if r > 0}
        self._batch = settings.batch
        self.rounds = 0  # rounds this pod ran (it held the lock)
        self.skipped = 0  # rounds skipped: another pod held the lock
        self.last_round: PruneRound | None = None
        self.holding = False  # this pod holds the janitor lease (as of its last round)
        for kind in PRUNE_QUERIES:
            metrics.JOBS_PRUNED.labels(kind)  # every kind's series exists from the start (0)

    async def tick(self) -> float | None:
        if not self._retentions_s:
            self.retired = True  # every kind is kept forever
            return None
        try:
            self.holding = await self._store.maintenance_lease_take(
                self.LEASE_NAME, self.LEASE_INTERVALS * self.interval_s
            )
            done = (
                None
                if not self.holding
                else await prune_round(
                    self._store, self._retentions_s, self._batch, self.ROUND_STATEMENTS
                )
            )
        except StoreError:
            metrics.JANITOR_LAG.clear()  # no fresh figure from this pod
            raise
        if done is None:
            self.skipped += 1
            metrics.JANITOR_LAG.clear()  # the pod pruning now exports it
            return None
        self.rounds += 1
        self.last_round = done
        for kind, n in done.deleted.items():
            metrics.JOBS_PRUNED.labels(kind).inc(n)
        for kind, retention_s in self._retentions_s.items():
            age_s = done.oldest_age_s[kind]
            metrics.JANITOR_LAG.labels(kind).set(
                0.0 if age_s is None else max(0.0, age_s - retention_s)
            )
        return jittered(self.CATCH_UP_S) if done.more else None

    async def release(self) -> None:
        """Give the janitor lease up (shutdown): another pod prunes at its next round."""
        if self.holding:
            self.holding = False
            await self._store.maintenance_lease_release(self.LEASE_NAME)


class PlannerStats(PeriodicService):
    """Refreshes the jobs table's statistics when they fall far behind (see
    dispatcher/db/sql/maintenance.sql).

    A workers' role with DML only may not ANALYZE: it learns that on its first tick, says so
    once, and stops asking; autovacuum (and the owner) keep the statistics fresh instead."""

    name = "analyze"

    async def tick(self) -> None:
        try:
            await self._store.jobs_analyze_if_stale()
        except StorePermissionDenied as exc:
            self.retired = True
            log.warning(
                "planner statistics: %s, so this worker will not refresh them (not retried). That "
                "is the "
                "table owner's job, and autovacuum does it; to let workers refresh them right "
                "after a bulk "
                "load too: %s",
                exc.reason,
                exc.hint or "see docs/operations/roles.md",
            )
