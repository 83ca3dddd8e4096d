"""Recurring jobs: each schedule's jobs are enqueued ahead of their slots by one worker per queue.

Every worker ticks every INTERVAL_S (jittered) and tries each of its queues' `schedules:<queue>`
maintenance leases (migration 0006: database clock, LEASE_INTERVALS ticks long, given up at
shutdown). The holder runs the queue's round (round.py): its declared schedules against
the database's copy, the jobs of the slots due within LOOKAHEAD_S, the missed ones by catch_up,
the runs that ended; and exports each schedule's last success. LOOKAHEAD_S is longer than the
lease's take-over, so a holder's death delays no slot: the next holder finds them enqueued.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from dispatcher.api.schedules.declarations import Schedule
from dispatcher.api.schedules.round import ScheduleRound, schedule_round
from dispatcher.backoff import jittered
from dispatcher.constants import COMPLETED_DELETE
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.observe import metrics

log = logging.getLogger(__name__)

LEASE_PREFIX = "schedules:"


class Scheduler(PeriodicService):
    name = "schedules"
    INTERVAL_S = 1.0
    # A worker that declares no schedule for its queues still takes part (a deploy that removes
    # the last schedule of a queue is noticed by one of them), at a slower pace.
    IDLE_INTERVAL_S = 15.0
    LEASE_INTERVALS = 5
    # Enqueued this far ahead: more than the lease's take-over (5 ticks, +10% jitter, + a round).
    LOOKAHEAD_S = 10.0
    # A slot found later than this past its time was missed (nobody could enqueue it ahead):
    # its schedule's catch_up decides. Later than a tick, or a slow round would count as a miss.
    LATE_S = 2.0
    KEEP_RUNS = 1000  # ended runs kept per schedule, for `schedules list` and the admin API

    def __init__(
        self,
        store: JobStore,
        schedules: Sequence[Schedule],
        queues: Sequence[str],
        *,
        completed_jobs: str,
        interval_s: float | None = None,
        defers: Callable[[str], bool] = lambda queue: False,
        yielding: Callable[[str], list[str]] = lambda queue: [],
    ) -> None:
        """`defers(queue)`: a younger live worker declares other schedules for `queue` (a newer
        release, runtime/presence.py): this one leaves the queue's lease to it. `yielding(queue)`:
        the older ones that defer to this one, whose lease it takes at once."""
        self._defers = defers
        self._yielding = yielding
        self._declared = {queue: [s for s in schedules if s.queue == queue] for queue in queues}
        if interval_s is None:
            interval_s = self.INTERVAL_S if any(self._declared.values()) else self.IDLE_INTERVAL_S
        super().__init__(store, interval_s, first_delay_s=0.0)  # the first slots are due soon
        elsewhere = sorted(s.name for s in schedules if s.queue not in queues)
        if elsewhere:
            log.info(
                "schedules %s are for queues this worker does not serve: their queues' workers "
                "enqueue them",
                ", ".join(elsewhere),
            )
        self._gone = "completed" if completed_jobs == COMPLETED_DELETE else "gone"
        self.holding: set[str] = set()
        self.enqueued = 0
        self.rounds = 0

    async def tick(self) -> float | None:
        for queue, declared in self._declared.items():
            if self._defers(queue):
                # During a rollout the newest release's declarations win, whoever held the lease.
                if queue in self.holding:
                    self._let_go(queue)
                    await self._store.maintenance_lease_release(LEASE_PREFIX + queue)
                continue
            try:
                held = await self._store.maintenance_lease_take(
                    LEASE_PREFIX + queue,
                    self.LEASE_INTERVALS * self.interval_s,
                    self._yielding(queue),
                )
            except StoreError:
                self._let_go(queue)
                raise
            if not held:
                self._let_go(queue)
                continue
            if queue not in self.holding:
                self.holding.add(queue)
                log.info(
                    "enqueuing the schedules of queue %s (%d declared here)", queue, len(declared)
                )
            done = await schedule_round(
                self._store,
                queue,
                declared,
                gone=self._gone,
                lookahead_s=self.LOOKAHEAD_S,
                late_s=self.LATE_S,
                keep_runs=self.KEEP_RUNS,
            )
            if done is not None:
                self.rounds += 1
                self._report(declared, done)
        return jittered(self.interval_s)

    def _report(self, declared: Sequence[Schedule], done: ScheduleRound) -> None:
        for s in declared:
            if s.name in done.declared:
                log.info(
                    "schedule %s (%s, %s) declared: next slot %s",
                    s.name,
                    s.cadence.text,
                    s.cadence.time_zone,
                    s.cadence.next_after(done.now).isoformat(),
                )
            n = done.enqueued.get(s.name, 0)
            if n:
                self.enqueued += n
                metrics.SCHEDULE_JOBS.labels(s.name).inc(n)
            plan = done.missed.get(s.name)
            if plan is not None and plan.missed is not None:
                log.warning(
                    "schedule %s missed its slots from %s to %s (no worker enqueued them in time); "
                    "catch_up=%s: %d of them run now",
                    s.name,
                    plan.missed[0].isoformat(),
                    plan.missed[1].isoformat(),
                    s.catch_up,
                    plan.missed_run,
                )
            metrics.SCHEDULE_LAST_SUCCESS.labels(s.name).set(done.last_success[s.name])
            metrics.SCHEDULE_PERIOD.labels(s.name).set(s.cadence.period_s(done.now))
        for name in done.removed:
            log.info("schedule %s is no longer declared: it enqueues nothing more", name)

    def _let_go(self, queue: str) -> None:
        """Not (or no longer) the queue's holder: the holder exports its schedules' figures."""
        if queue in self.holding:
            self.holding.discard(queue)
            log.info(
                "no longer enqueuing the schedules of queue %s: another worker holds them", queue
            )
        for s in self._declared[queue]:
            for gauge in (metrics.SCHEDULE_LAST_SUCCESS, metrics.SCHEDULE_PERIOD):
                with contextlib.suppress(KeyError):
                    gauge.remove(s.name)

    async def release(self) -> None:
        """Give the leases up (shutdown): another pod enqueues at its next tick."""
        for queue in sorted(self.holding):
            self.holding.discard(queue)
            await self._store.maintenance_lease_release(LEASE_PREFIX + queue)
