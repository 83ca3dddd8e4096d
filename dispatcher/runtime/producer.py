"""The producer: claims jobs for the executor's free slots.

It sleeps until something may have work for it (a NOTIFY for its buckets, an assignment change,
a reaped lease, the due timer or the jittered poll timer), then claims from its own buckets per
queue (partitioned) or from everything (SKIP LOCKED), and may steal (stealing.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.assignment import BucketAssignment
from dispatcher.backoff import jittered
from dispatcher.constants import NUM_BUCKETS
from dispatcher.db.rows import Claimed, Gate, Steal, TypeFilter
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.model import Job
from dispatcher.observe import metrics
from dispatcher.runtime.claim_windows import ClaimWindows, beyond_window, window_buckets
from dispatcher.runtime.due_timer import DueTimer
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.flow_control import FlowControl
from dispatcher.runtime.stealing import StealPolicy
from dispatcher.runtime.vitals import Vitals
from dispatcher.settings.sections import ClaimSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ProducerStats:
    claims: int = 0  # claim statements, steals included
    claimed: int = 0
    steal_claims: int = 0  # statements
    # steal attempts: each one statement per MAX_VICTIMS buckets, until one finds jobs
    steals: int = 0
    stolen: int = 0
    outranked: int = 0  # window claims vetoed (claim_windows.py): a claim of all buckets followed


class Producer:
    STALLED_CHECK_S = 0.5
    # A poll wake-up looks ahead at most once a second: it only catches what no signal announced,
    # and each look-ahead walks the index from its start (cost: docs/design/claims.md).
    LOOK_AHEAD_POLL_S = 1.0
    # A limited type at its max_running with jobs waiting: try its gated claim again this often
    # (jittered). Others' jobs end unseen by us, so there is nothing to wait on but time.
    FLOW_RECHECK_S = 0.25

    def __init__(
        self,
        settings: ClaimSettings,
        store: JobStore,
        assignments: Mapping[str, BucketAssignment],
        executor: Executor,
        *,
        vitals: Vitals | None = None,
        flow: FlowControl | None = None,
    ) -> None:
        """`flow`: the fleet's limits and paused queues as this worker reads them, shared with the
        completer (its urgent types); one of its own when not given."""
        self._claims = config = settings
        # Written: claims_failing_since. Read: stalled (heartbeats fail: claim nothing).
        self._vitals = vitals if vitals is not None else Vitals()
        self._store = store
        missing = set(config.queues) - set(assignments)
        if missing:
            raise ValueError(f"no bucket assignment for queues {sorted(missing)}")
        self._assignments = dict(assignments)
        # Distinct objects: static and SKIP LOCKED configs share one assignment across queues.
        self._distinct = list({id(a): a for a in self._assignments.values()}.values())
        self._executor = executor
        self._partitioned = config.partitioned
        self._mode = config.mode
        self._claim_fence = asyncio.Lock()  # held while a claim statement runs
        self._wakeup = asyncio.Event()
        self._stopped = asyncio.Event()
        self._woke_by_timer = True  # the first cycle may steal: a backlog may be waiting already
        self._due = DueTimer(self._on_due)
        # Ask the database for our next run_at before the next claim (jobs_next_due_in): at
        # start-up, after a poll or due-timer wake-up, a bulk NOTIFY and an assignment change; never
        # after a per-job NOTIFY (it carries its run_at). Why each: docs/design/claims.md.
        self._look_ahead = True
        # time.monotonic() from which a poll wake-up looks ahead again
        self._poll_look_ahead_at = 0.0
        # A steal leaves each bucket the jobs its owner takes in one claim (the fleet is assumed to
        # share its claim settings): what the owner is about to claim anyway is not worth a race.
        self._steals = StealPolicy(
            config.steal_batch, config.batch_size, min(config.batch_size, config.concurrency)
        )
        # After a full batch (a backlog exists) wait until a quarter of the slots are free rather
        # than claiming a handful at a time: fewer, fuller claims are cheaper for PostgreSQL.
        self._refill_at = max(1, min(config.batch_size, config.concurrency) // 4)
        # claims of a backlog take ~refill_at jobs
        self._windows = ClaimWindows(window_buckets(self._refill_at))
        self._asleep = False  # in _sleep_until_woken
        # The fleet's limits and paused queues (flow_control.py); a claim that finds them changed
        # sets _flow_stale and the cycle reads them again before claiming more.
        self.flow = (
            flow if flow is not None else FlowControl(store, config.queues, vitals=self._vitals)
        )
        self._flow_stale = False
        self._flow_timer: asyncio.TimerHandle | None = None
        # A gated claim found its max_running taken: try again as soon as our own outcomes are
        # written (a slot may be ours to take), not only at the recheck timer.
        self._held_by_running = False
        self.stats = ProducerStats()

    @property
    def idle(self) -> bool:
        """Test signal: the claim loop sleeps and nothing has woken it yet (no NOTIFY, assignment
        change or reap pending), so only its poll timer would start the next claim."""
        return (
            self._asleep
            and not self._wakeup.is_set()
            and not any(a.changed.is_set() for a in self._distinct)
        )

    @property
    def claiming(self) -> bool:
        """Not stopped: jobs may still be claimed and started here."""
        return not self._stopped.is_set()

    # -- signals from outside ----------------------------------------------------------------------

    def wake(self) -> None:
        self._wakeup.set()

    def on_notify(self, queue: str, bucket: int | None, due_in_s: float | None = None) -> None:
        """A NOTIFY from enqueue: wake only for our own buckets (or a bulk enqueue). A job not due
        yet (`due_in_s`) only arms the due timer: claiming now would find nothing."""
        if queue not in self._assignments:
            return
        if bucket is not None and self._partitioned:
            owned = self._assignments[queue].owned()
            if owned is not None and bucket not in owned:
                if due_in_s is not None:
                    return  # not work for anyone yet: no reason to end the steal back-off
                self._steals.note_foreign_notify()
                return  # another worker's bucket: its owner gets the same notification
        if due_in_s is not None:
            self._due.arm(due_in_s)
            return
        self._store.note_ready(queue, bucket)
        if bucket is None:
            self._steals.note_foreign_notify()  # a bulk enqueue: any bucket may have new work
            self._look_ahead = True  # and may have scheduled some for later
        self._wakeup.set()

    def _on_due(self) -> None:
        self._store.note_ready(None)  # the due jobs' buckets are not known here
        self._look_ahead = True  # learn the next run_at as we claim these
        self._wakeup.set()

    async def on_revoke(self, buckets: tuple[int, ...]) -> None:
        """The coordinator takes `buckets` away (already gone from owned()): return once the
        claim in flight, which may still read them, has finished."""
        async with self._claim_fence:
            pass

    def stop(self) -> None:
        """Stop claiming. A claim in flight finishes and its jobs start (nothing is orphaned)."""
        self._stopped.set()
        self._due.cancel()
        if self._flow_timer is not None:
            self._flow_timer.cancel()
        self._wakeup.set()
        self._executor.slot_freed.set()

    # -- the claim loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        followers = [
            asyncio.create_task(self._follow_assignment(a), name="assignment-follower")
            for a in self._distinct
        ]
        followers.append(asyncio.create_task(self.flow.run(self.wake), name="flow-control"))
        try:
            await self._claim_loop()
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)

    async def _follow_assignment(self, assignment: BucketAssignment) -> None:
        while True:
            await assignment.changed.wait()
            assignment.changed.clear()
            self._look_ahead = True  # gained buckets may hold jobs scheduled for later
            self._wakeup.set()

    async def _claim_loop(self) -> None:
        config, executor = self._claims, self._executor
        backlog = False
        queues = list(config.queues)
        while not self._stopped.is_set():
            # per cycle, not per job: cheap and never stale for long
            metrics.JOBS_IN_FLIGHT.set(executor.in_flight)
            if config.concurrency - executor.in_flight < (self._refill_at if backlog else 1):
                executor.slot_freed.clear()
                await executor.slot_freed.wait()
                continue
            if self._vitals.stalled:
                # Jobs claimed now would have leases we cannot extend; the lease keeper probes
                # every second and clears this when the database answers again.
                backlog = False
                await self._pause(self.STALLED_CHECK_S)
                continue
            # Cleared before claiming, not after: a NOTIFY that lands while the claim runs (after
            # its snapshot) must still wake the next cycle.
            self._wakeup.clear()
            owns = {q: self._assignments[q].owned() if self._partitioned else None for q in queues}
            # Not for a degraded queue (own is None): its claims are SKIP LOCKED over all buckets
            # already. Pointless for a queue whose every bucket we own.
            stealing = (
                self._partitioned
                and config.steal
                and any(_can_steal(own) for own in owns.values())
                and self._steals.due(self._woke_by_timer)
            )
            if all(own == () for own in owns.values()) and not stealing:
                await self._sleep_until_woken()
                continue
            try:
                if not self.flow.loaded or self._flow_stale:
                    self._flow_stale = False
                    if await self.flow.refresh():
                        self.wake()
                if self._look_ahead and not backlog:
                    # Not during a backlog (the next claim takes a job that came due), and before
                    # the claim, not after, so no job falls between the two statements
                    # (measurements: docs/design/claims.md, "Look-aheads").
                    await self._arm_next_due(queues, owns)
                cycle_started = time.perf_counter()
                backlog = await self._claim_cycle(queues, owns, stealing, backlog)
            except StoreError as exc:
                metrics.STORE_ERRORS.labels("claim").inc()
                log.warning("claim failed: %s", exc)
                if self._vitals.claims_failing_since is None:
                    self._vitals.claims_failing_since = time.monotonic()
                backlog = False
                # Not woken early by NOTIFYs: back off so a struggling database is not hammered.
                await self._pause(jittered(min(5.0, config.poll_interval_s), 0.5))
                continue
            self._vitals.claims_failing_since = None
            queues.append(queues.pop(0))  # rotate: no queue always goes first
            metrics.POLL_CYCLE_SECONDS.labels(self._mode).observe(
                time.perf_counter() - cycle_started
            )
            # one left from a backlog: look ahead, claim, then sleep
            if not backlog and not self._look_ahead:
                await self._sleep_until_woken()

    async def _claim_cycle(
        self,
        queues: list[str],
        owns: Mapping[str, tuple[int, ...] | None],
        stealing: bool,
        in_backlog: bool,
    ) -> bool:
        """One claim per queue for the free slots, plus a steal where our own came up short.
        Returns whether any claim came back full (a backlog: go again without sleeping)."""
        config, executor = self._claims, self._executor
        backlog = False
        for queue in queues:
            free = config.concurrency - executor.in_flight
            if free <= 0 or self._stopped.is_set() or self._flow_stale:
                break
            own = owns[queue]
            if self.flow.paused(queue):
                continue
            plan = self.flow.plan(queue)
            types = None if plan is None else plan.rest
            if plan is not None and own != ():
                backlog |= await self._claim_gated(queue, plan.gates, own)
                free = config.concurrency - executor.in_flight
                if not plan.ungated or free <= 0 or self._flow_stale:
                    continue  # every type of this queue is gated: no plain claim, no steal
            limit = min(free, config.batch_size)
            selected, windowed = -1, False
            if own != ():
                buckets, windowed = self._windows.pick(queue, own) if in_backlog else (own, False)
                beyond = beyond_window(own, buckets) if windowed and own and buckets else None
                claimed, sent_at = await self._claim(
                    queue, limit, buckets, types=types, beyond=beyond
                )
                if claimed.outranked and not self._stopped.is_set():
                    # Another of our buckets has a due job of better priority than the window's:
                    # read them all, now and until this backlog ends, so that it starts first.
                    self.stats.outranked += 1
                    self._windows.outranked(queue)
                    windowed = False
                    claimed, sent_at = await self._claim(queue, limit, own, types=types)
                jobs, selected = claimed.jobs, claimed.selected
                # A full selection means more may be waiting even if others took some of it (a
                # stealer, or the previous owner during a hand-off): go again, do not sleep. A
                # short window says only that its buckets ran low: go on (claim_windows.py).
                if windowed:
                    self._windows.record(queue, selected >= limit)
                elif selected < limit:
                    self._windows.ended(queue)
                if selected >= limit:
                    self._steals.note_own_backlog()
                backlog |= windowed or selected >= limit
                executor.start(jobs, sent_at)
            free = config.concurrency - executor.in_flight
            # Steal only where all our own buckets ran short, not where others took rows of them.
            if (
                stealing
                and not windowed
                and _can_steal(own)
                and selected < limit
                and free > 0
                and not self._stopped.is_set()
            ):
                asked = self._steals.batch(free)
                stolen: list[Job] = []
                sent_at = 0.0
                self.stats.steals += 1
                for victims in self._steals.sweep(own or ()):
                    steal = Steal(tuple(victims), self._steals.reserve())
                    took, sent_at = await self._claim(queue, asked, None, steal, types=types)
                    stolen = took.jobs
                    self.stats.steal_claims += 1
                    if stolen or self._stopped.is_set():
                        break
                self._steals.record(len(stolen), asked, {job.bucket for job in stolen})
                if stolen:
                    self.stats.stolen += len(stolen)
                    metrics.STOLEN_JOBS.inc(len(stolen))
                backlog |= len(stolen) == asked
                executor.start(stolen, sent_at)
        return backlog or self._flow_stale

    async def _claim_gated(
        self, queue: str, gates: tuple[Gate, ...], own: tuple[int, ...] | None
    ) -> bool:
        """The gated claims of a flow-controlled queue (one per limited type: claims.py), from the
        same buckets as the plain claim. Returns whether one came back full (a backlog)."""
        config, executor = self._claims, self._executor
        backlog = False
        for gate in gates:
            free = config.concurrency - executor.in_flight
            if free <= 0 or self._stopped.is_set():
                break
            asked = min(free, config.batch_size)
            started, sent_at = time.perf_counter(), time.monotonic()
            async with self._claim_fence:
                claimed = await self._store.jobs_claim(
                    queue, asked, config.lease_s, own, gate=gate, flow_version=self.flow.version
                )
            if claimed.stale:
                self._flow_stale = True
                return True
            self._count_claim(queue, claimed.jobs, started)
            executor.start(claimed.jobs, sent_at)
            if claimed.held_by is not None:
                self._held_by_running |= claimed.held_by == "max_running"
                metrics.FLOW_HELD_BACK.labels(queue, claimed.held_by).inc()
                self._recheck_flow(
                    claimed.wait_s
                    if claimed.wait_s is not None
                    else jittered(self.FLOW_RECHECK_S, 0.2)
                )
            elif claimed.selected >= asked:
                backlog = True
        return backlog

    def outcomes_written(self) -> None:
        """The completer wrote outcomes: a max_running slot a gated claim waits for may be free."""
        if self._held_by_running:
            self._held_by_running = False
            self._wakeup.set()

    def _recheck_flow(self, delay_s: float) -> None:
        """Wake the claim loop in `delay_s` (the earliest of those asked for) to try the limits
        again."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.005, delay_s)
        if self._flow_timer is not None:
            if self._flow_timer.when() <= when:
                return
            self._flow_timer.cancel()
        self._flow_timer = loop.call_at(when, self._flow_due)

    def _flow_due(self) -> None:
        self._flow_timer = None
        self._wakeup.set()

    async def _claim(
        self,
        queue: str,
        limit: int,
        buckets: tuple[int, ...] | None,
        steal: Steal | None = None,
        *,
        types: TypeFilter | None = None,
        beyond: tuple[int, ...] | None = None,
    ) -> tuple[Claimed, float]:
        """Claim; returns the claim (its jobs, how many the selection found) and when the statement
        was sent (time.monotonic()): their leases run from no earlier than that. `beyond`: our
        buckets outside the window `buckets` (the store's `outside`: the veto's)."""
        started = time.perf_counter()
        sent_at = time.monotonic()
        async with self._claim_fence:  # a bucket hand-off waits for this claim to finish
            claimed = await self._store.jobs_claim(
                queue,
                limit,
                self._claims.lease_s,
                buckets,
                steal,
                types=types,
                flow_version=self.flow.version,
                outside=beyond,
            )
        if claimed.stale:
            self._flow_stale = True
        self._count_claim(queue, claimed.jobs, started)
        return claimed, sent_at

    def _count_claim(self, queue: str, jobs: list[Job], started: float) -> None:
        metrics.CLAIM_SECONDS.labels(self._mode).observe(time.perf_counter() - started)
        metrics.CLAIM_BATCH.observe(len(jobs))
        if jobs:
            metrics.JOBS_CLAIMED.labels(queue, self._mode).inc(len(jobs))
        self.stats.claims += 1
        self.stats.claimed += len(jobs)

    async def _arm_next_due(
        self, queues: list[str], owns: Mapping[str, tuple[int, ...] | None]
    ) -> None:
        """Arm the due timer at our earliest not-yet-due job (one bounded query per queue we claim
        from). Raises StoreError like a claim."""
        self._look_ahead = False
        self._poll_look_ahead_at = time.monotonic() + self.LOOK_AHEAD_POLL_S
        for queue in queues:
            own = owns[queue]
            if own == ():
                continue
            # all: no bucket filter
            buckets = None if own is None or len(own) == NUM_BUCKETS else own
            # a StoreError: as the claim's
            due_in_s = await self._store.jobs_next_due_in(queue, buckets)
            if due_in_s is not None:
                self._due.arm(due_in_s)

    async def _sleep_until_woken(self) -> None:
        """Wait for a NOTIFY, an assignment change, a stop, or the jittered poll interval."""
        if self._stopped.is_set():
            return
        self._asleep = True
        try:
            await asyncio.wait_for(self._wakeup.wait(), jittered(self._claims.poll_interval_s, 0.2))
            self._woke_by_timer = False
        except TimeoutError:
            self._woke_by_timer = True
            if time.monotonic() >= self._poll_look_ahead_at:
                self._look_ahead = True
        finally:
            self._asleep = False

    async def _pause(self, seconds: float) -> None:
        """Sleep, cut short only by stop()."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)


def _can_steal(own: tuple[int, ...] | None) -> bool:
    """Stealing from a queue's other buckets makes sense when we own some but not all of them
    (own is None: degraded, already claiming everything with SKIP LOCKED)."""
    return own is not None and len(own) < NUM_BUCKETS
