"""Maintenance: small periodic services beside the job path, each with one job.

`LeaseKeeper` (heartbeats, and cancel requests), `Reaper` (expired leases through the retry
policy) and `PlannerStats` (ANALYZE when statistics fall far behind); retention's `Pruner` is in
janitor.py. Each ticks every jittered interval (db/periodic.py); errors are counted and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dispatcher.backoff import HandlerRetry, jittered
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.rows import Failure, HistoryRows
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError, StorePermissionDenied
from dispatcher.model import STATUS_QUEUED, FailureKind
from dispatcher.observe import metrics
from dispatcher.runtime import joblog
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.held_jobs import TAKEN_OVER
from dispatcher.runtime.retry import RetryPolicy, lease_expired_error
from dispatcher.runtime.vitals import Vitals
from dispatcher.settings.sections import LeaseSettings, MaintenanceSettings

log = logging.getLogger(__name__)


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
            # Counted by the executor (dispatcher_leases_lost_total{reason="taken_over"}), as are
            # the leases its own timer gives up while heartbeats fail (reason="ran_out").
            self._executor.lose(
                [j.id for j in due if j.id not in kept],
                "taken over: its lease had run out and another worker or a reaper got it",
                TAKEN_OVER,
            )
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
                bucket=e.bucket,
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


class PlannerStats(PeriodicService):
    """Refreshes the jobs table's statistics when they fall far behind (see
    dispatcher/db/sql/maintenance.sql).

    A workers' role with DML only may not ANALYZE: it learns that on its first tick, says so
    once, and stops asking. That is the documented two-role setup (docs/operations/roles.md), in
    which autovacuum (and the owner) keep the statistics fresh: an INFO line. A WARNING only when
    autovacuum is off for the table too, since then nobody refreshes them."""

    name = "analyze"

    async def tick(self) -> None:
        try:
            await self._store.jobs_analyze_if_stale()
        except StorePermissionDenied as exc:
            self.retired = True
            hint = exc.hint or "see docs/operations/roles.md"
            try:
                covered = await self._store.jobs_autovacuum_on()
            except StoreError as failed:  # not knowing is no reason to alarm: the default is on
                log.debug("planner statistics: cannot tell whether autovacuum is on: %s", failed)
                covered = True
            if covered:
                log.info(
                    "planner statistics: %s, so this worker leaves them to autovacuum (not asked "
                    "again). To let workers refresh them right after a bulk load too: %s",
                    exc.reason,
                    hint,
                )
            else:
                log.warning(
                    "planner statistics: %s, and autovacuum is off for dispatcher_jobs "
                    "(autovacuum, track_counts or the table's autovacuum_enabled): nobody "
                    "refreshes them, and claims may pick slow plans as the table grows. Turn "
                    "autovacuum on for the table, or let workers refresh them: %s",
                    exc.reason,
                    hint,
                )
