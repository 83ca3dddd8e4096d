"""The worker: claim batches, run handlers, write outcomes in batches, keep leases alive.

Lifecycle of a job inside one worker process:

    claim (one statement, a batch)  ->  start handler  ->  outcome buffered  ->  flush (one statement)
                                         |  heartbeat extends the lease while it runs
                                         |  timeout cancels it; failure schedules a retry

and of the worker itself: `run()` starts the loops, waits for `stop()` (SIGTERM/SIGINT in the
CLI), then shuts down in order: stop claiming, give back unstarted jobs, let running ones finish
within the grace period, flush outcomes (shielded from cancellation), close.

Hot-path budget (PERF-NOTES: ~3 us of client CPU per job is what plain SQL costs): an async
handler that finishes without awaiting runs to completion inside an eagerly started Task on
Python >= 3.12 (0.6 us instead of 6 us for a scheduled Task); counters move per batch; no
per-job timer unless the handler actually suspends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from coordinator.assignment import BucketAssignment
from coordinator.factory import build_assignment
from coordinator.metrics import STOLEN_JOBS

from . import metrics
from .backoff import jittered, retry_delay_s
from .completer import Completer
from .config import Config
from .constants import (LAST_ERROR_MAX_CHARS, MODE_PARTITIONED, NUM_BUCKETS, STATUS_DISCARDED,
                        STATUS_FAILED, STATUS_QUEUED)
from .errors import PermanentJobError, StoreError
from .listener import Listener
from .registry import Handler, Registry
from .stealing import StealPolicy
from .store import Failure, Job, JobStore

log = logging.getLogger(__name__)

_EAGER_TASKS = sys.version_info >= (3, 12)


def _new_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    if _EAGER_TASKS:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    return loop.create_task(coro)


@dataclass(slots=True)
class _Running:
    job: Job
    started: float  # time.monotonic() at claim: decides when its lease needs extending
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class WorkerStats:
    claims: int = 0
    claimed: int = 0
    stolen: int = 0
    steal_claims: int = 0
    released: int = 0
    reaped: int = 0
    leases_lost: int = 0
    timeouts: int = 0


class Worker:
    def __init__(self, config: Config, registry: Registry, assignment: BucketAssignment | None = None) -> None:
        if config.dsn is None:
            raise ValueError("Config.dsn is required to run a worker")
        self.config = config
        self.registry = registry
        self.partitioned = config.mode == MODE_PARTITIONED
        self.assignment = assignment or build_assignment(config)
        self._claim_fence = asyncio.Lock()
        self.assignment.bind_claim_fence(self._claim_fence)
        self._claims = JobStore(config.dsn, config.worker_id, application_name="dispatcher-claim")
        self._maintenance = JobStore(config.dsn, config.worker_id, application_name="dispatcher-maint")
        self.completer = Completer(
            JobStore(config.dsn, config.worker_id, application_name="dispatcher-complete"),
            flush_interval_s=config.flush_interval_s,
            flush_max=config.flush_max,
            history=config.history,
        )
        self._listener = Listener(config.dsn, set(config.queues), self._on_notify)
        self._threads = ThreadPoolExecutor(config.sync_threads, thread_name_prefix="dispatcher-sync")
        self._running: dict[int, _Running] = {}  # jobs that suspended or wait for a thread
        self._sync_backlog: collections.deque[_Running] = collections.deque()
        self._sync_busy = 0
        self._in_flight = 0
        self._slot_freed = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._stop = asyncio.Event()
        self._stopping = False
        self._timed_out: set[int] = set()
        self._grace_override: float | None = None
        self._woke_by_timer = True  # the first cycle may steal: a backlog may be waiting already
        self._steals = StealPolicy(config.steal_batch, config.batch_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mode_label = config.mode
        self.stats = WorkerStats()
        self.started = asyncio.Event()  # test signal: loops are up

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.assignment.start()
        await self._listener.start()
        background = [
            asyncio.create_task(self.completer.run(), name="completer"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._reaper_loop(), name="reaper"),
            asyncio.create_task(self._prune_loop(), name="pruner"),
            asyncio.create_task(self._assignment_loop(), name="assignment"),
        ]
        claim_loop = asyncio.create_task(self._claim_loop(), name="claim")
        self.started.set()
        log.info(
            "worker %s running: mode=%s queues=%s concurrency=%d buckets=%s",
            self.config.worker_id, self.config.mode, ",".join(self.config.queues),
            self.config.concurrency, _fmt_buckets(self.assignment.owned()) if self.partitioned else "all",
        )
        try:
            await self._stop.wait()
        finally:
            await asyncio.shield(self._shutdown(claim_loop, background))

    def stop(self, *, grace_s: float | None = None) -> None:
        """Begin a graceful shutdown (idempotent; call from a signal handler)."""
        if grace_s is not None:
            self._grace_override = grace_s
        self._stopping = True
        self._stop.set()
        self._wakeup.set()
        self._slot_freed.set()

    async def _shutdown(self, claim_loop: asyncio.Task[None], background: list[asyncio.Task[None]]) -> None:
        # 1. Stop claiming. The loop is never cancelled mid-statement: a claim in flight finishes
        #    and its jobs are started (or given back below), so no claimed job is orphaned.
        self._stopping = True
        await asyncio.gather(claim_loop, return_exceptions=True)
        # Leave the coordination group now, not after the grace period: our buckets move to the
        # others at once (within a second) while our running jobs finish here.
        await self.assignment.stop()
        # 2. Jobs claimed but not started give back at once, uncounted, for another worker.
        await self._release_unstarted()
        # 3. Running jobs get the grace period, then are cancelled (recorded as interrupted).
        grace = self._grace_override if self._grace_override is not None else self.config.shutdown_grace_s
        await self._drain_running(grace)
        # 4. Every outcome reaches the database before we close.
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self._flush_until_done()
        await self._listener.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)
        for store in (self._claims, self._maintenance, self.completer.store):
            await store.close()
        log.info("worker %s stopped: %s %s", self.config.worker_id, self.stats, self.completer.stats)

    async def _release_unstarted(self) -> None:
        unstarted = [r.job for r in self._sync_backlog]
        self._sync_backlog.clear()
        if not unstarted:
            return
        for job in unstarted:
            self._running.pop(job.id, None)
            self._finish_slot()
        for attempt in range(5):
            try:
                released = await self._maintenance.jobs_release_owned(unstarted)
                self.stats.released += released
                metrics.JOBS_RELEASED.inc(released)
                log.info("released %d claimed-but-unstarted jobs", released)
                return
            except StoreError as exc:
                log.warning("release of unstarted jobs failed (try %d): %s", attempt + 1, exc)
                await asyncio.sleep(0.2 * 2**attempt)
        log.error("could not release %d unstarted jobs; their leases will bring them back", len(unstarted))

    async def _drain_running(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while self._in_flight > 0 and time.monotonic() < deadline:
            self._slot_freed.clear()
            try:
                await asyncio.wait_for(self._slot_freed.wait(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        leftover = [r for r in self._running.values() if r.task is not None and not r.task.done()]
        if leftover:
            log.warning("grace period over: interrupting %d running jobs", len(leftover))
            for r in leftover:
                r.task.cancel()  # type: ignore[union-attr]
            await asyncio.gather(*(r.task for r in leftover), return_exceptions=True)  # type: ignore[misc]
        # Sync handlers cannot be interrupted; whatever still runs in a thread is given back as an
        # interrupted attempt, and its late result (if the process lives on) is fenced.
        for r in list(self._running.values()):
            if r.task is None:
                del self._running[r.job.id]
                self._record_failure(r.job, "interrupted: worker shut down while a sync handler ran", r.started, retry_now=True)

    async def _flush_until_done(self) -> None:
        for attempt in range(10):
            try:
                await self.completer.flush()
                return
            except StoreError as exc:
                log.warning("final flush failed (try %d): %s", attempt + 1, exc)
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        log.error("gave up flushing %d outcomes; their leases will bring the jobs back", self.completer.pending)

    # -- claiming ----------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        config = self.config
        # After a full batch (a backlog exists) wait until a quarter of the slots are free rather
        # than claiming a handful at a time: fewer, fuller claims are cheaper for PostgreSQL.
        refill_at = max(1, min(config.batch_size, config.concurrency) // 4)
        backlog = False
        queues = list(config.queues)
        while not self._stopping:
            metrics.JOBS_IN_FLIGHT.set(self._in_flight)  # per cycle, not per job: cheap and never stale for long
            free = config.concurrency - self._in_flight
            if free < (refill_at if backlog else 1):
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            # Cleared before claiming, not after: a NOTIFY that lands while the claim runs (after
            # its snapshot) must still wake the next cycle.
            self._wakeup.clear()
            own = self.assignment.owned() if self.partitioned else None
            # Stealing: in partitioned mode, when our own buckets come up short, take a bounded
            # number of jobs from other buckets with SKIP LOCKED, so a hot bucket or a skewed
            # burst never leaves workers idle while jobs wait; when, is StealPolicy's call. Not
            # when degraded (own is None): every claim is SKIP LOCKED over all buckets already.
            # Pointless when we own every bucket.
            stealing = (self.partitioned and own is not None and config.steal and len(own) < NUM_BUCKETS
                        and self._steals.due(self._woke_by_timer))
            if own == () and not stealing:
                await self._sleep_until_woken()
                continue
            cycle_started = time.perf_counter()
            backlog = False
            try:
                for queue in queues:
                    free = config.concurrency - self._in_flight
                    if free <= 0 or self._stopping:
                        break
                    limit = min(free, config.batch_size)
                    got = -1
                    if own != ():
                        jobs = await self._claim(queue, limit, own)
                        got = len(jobs)
                        backlog |= got == limit
                        self._start_all(jobs)
                    free = config.concurrency - self._in_flight
                    if stealing and got < limit and free > 0 and not self._stopping:
                        steal = self._steals.batch(free)
                        stolen = await self._claim(queue, steal, None, steal_from=StealPolicy.victims(own))
                        self._steals.record(len(stolen), steal)
                        self.stats.steal_claims += 1
                        if stolen:
                            self.stats.stolen += len(stolen)
                            STOLEN_JOBS.inc(len(stolen))
                        backlog |= len(stolen) == steal
                        self._start_all(stolen)
            except StoreError as exc:
                metrics.STORE_ERRORS.labels("claim").inc()
                log.warning("claim failed: %s", exc)
                # Not woken early by NOTIFYs: back off so a struggling database is not hammered.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), jittered(min(5.0, config.poll_interval_s), 0.5))
                continue
            queues.append(queues.pop(0))  # rotate: no queue always goes first
            metrics.POLL_CYCLE_SECONDS.labels(self._mode_label).observe(time.perf_counter() - cycle_started)
            if not backlog:
                await self._sleep_until_woken()

    async def _claim(self, queue: str, limit: int, buckets: tuple[int, ...] | None,
                     steal_from: list[int] | None = None) -> list[Job]:
        started = time.perf_counter()
        async with self._claim_fence:  # a bucket hand-off waits for this claim to finish
            jobs = await self._claims.jobs_claim(queue, limit, self.config.lease_s, buckets, steal_from)
        metrics.CLAIM_SECONDS.labels(self._mode_label).observe(time.perf_counter() - started)
        metrics.CLAIM_BATCH.observe(len(jobs))
        if jobs:
            metrics.JOBS_CLAIMED.labels(queue, self._mode_label).inc(len(jobs))
        self.stats.claims += 1
        self.stats.claimed += len(jobs)
        return jobs

    async def _sleep_until_woken(self, timeout_s: float | None = None) -> None:
        """Wait for a NOTIFY, an assignment change, a stop, or the jittered poll interval."""
        if self._stopping:
            return
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout_s or jittered(self.config.poll_interval_s, 0.2))
            self._woke_by_timer = False
        except TimeoutError:
            self._woke_by_timer = True

    def _on_notify(self, queue: str, bucket: int | None) -> None:
        if bucket is not None and self.partitioned:
            owned = self.assignment.owned()
            if owned is not None and bucket not in owned:
                self._steals.note_foreign_notify()
                return  # another worker's bucket: its owner gets the same notification
        if bucket is None:
            self._steals.note_foreign_notify()  # a bulk enqueue: any bucket may have new work
        self._wakeup.set()

    async def _assignment_loop(self) -> None:
        while True:
            await self.assignment.changed.wait()
            self.assignment.changed.clear()
            self._wakeup.set()

    # -- running handlers --------------------------------------------------------------------------

    def _start_all(self, jobs: list[Job]) -> None:
        self._in_flight += len(jobs)
        loop = self._loop
        assert loop is not None
        for job in jobs:
            handler = self.registry.get(job.job_type)
            if handler is None:
                self._unknown_job_type(job)
            elif handler.is_async:
                self._start_async(loop, handler, job)
            else:
                entry = self._running[job.id] = _Running(job, time.monotonic())
                self._sync_backlog.append(entry)
        self._pump_sync()

    def _start_async(self, loop: asyncio.AbstractEventLoop, handler: Handler, job: Job) -> None:
        started = time.monotonic()
        task = _new_task(loop, self._run_async(handler, job, started))
        if task.done():
            return  # finished without awaiting: outcome already buffered, slot already freed
        entry = self._running[job.id] = _Running(job, started, task)
        timeout_s = handler.timeout_s or self.config.job_timeout_s
        if timeout_s:
            entry.timer = loop.call_later(timeout_s, self._time_out, entry)

    async def _run_async(self, handler: Handler, job: Job, started: float) -> None:
        try:
            await handler.fn(job)
        except asyncio.CancelledError:
            if job.id in self._timed_out:
                self._timed_out.discard(job.id)
                limit = handler.timeout_s or self.config.job_timeout_s
                self._record_failure(job, f"timed out after {limit:g} s", started)
            else:
                self._record_failure(job, "interrupted: worker shut down", started, retry_now=True)
        except Exception as exc:
            self._record_failure(job, exc, started)
        else:
            self.completer.completed(job, time.monotonic() - started)
        finally:
            entry = self._running.pop(job.id, None)
            if entry is not None and entry.timer is not None:
                entry.timer.cancel()
            self._finish_slot()

    def _time_out(self, entry: _Running) -> None:
        if entry.task is not None and not entry.task.done():
            self.stats.timeouts += 1
            self._timed_out.add(entry.job.id)
            entry.task.cancel()

    def _pump_sync(self) -> None:
        """Hand backlogged sync jobs to free threads; the rest wait here, claimed but unstarted."""
        loop = self._loop
        assert loop is not None
        while self._sync_backlog and self._sync_busy < self.config.sync_threads and not self._stopping:
            entry = self._sync_backlog.popleft()
            handler = self.registry.get(entry.job.job_type)
            assert handler is not None
            self._sync_busy += 1
            started = time.monotonic()
            future = loop.run_in_executor(self._threads, handler.fn, entry.job)
            future.add_done_callback(lambda f, e=entry, h=handler, s=started: self._sync_done(f, e, h, s))

    def _sync_done(self, future: asyncio.Future[Any], entry: _Running, handler: Handler, started: float) -> None:
        self._sync_busy -= 1
        if self._running.pop(entry.job.id, None) is not None:  # not already given up by shutdown
            limit = handler.timeout_s or self.config.job_timeout_s
            elapsed = time.monotonic() - started
            exc = None if future.cancelled() else future.exception()
            if limit and elapsed > limit:
                # A thread cannot be interrupted; an overrun is recorded as a timeout when it returns
                # (its lease was kept alive meanwhile, so it never ran twice at once).
                self.stats.timeouts += 1
                self._record_failure(entry.job, f"timed out after {limit:g} s (sync handler ran {elapsed:.1f} s)", started)
            elif exc is not None:
                self._record_failure(entry.job, exc, started)
            else:
                self.completer.completed(entry.job, elapsed)
            self._finish_slot()
        self._pump_sync()

    def _finish_slot(self) -> None:
        self._in_flight -= 1
        self._slot_freed.set()

    def _unknown_job_type(self, job: Job) -> None:
        # Failed at once, not retried: a missing handler will not appear by waiting, and retrying
        # every few seconds would be a storm of pointless claims.
        known = ", ".join(self.registry.job_types()) or "none"
        message = f"no handler registered for job_type {job.job_type!r} in worker {self.config.worker_id} (known: {known})"
        self.completer.failed(Failure(job, STATUS_FAILED, 0.0, message), 0.0)
        self._finish_slot()

    def _record_failure(self, job: Job, error: BaseException | str, started: float, *, retry_now: bool = False) -> None:
        text = error if isinstance(error, str) else _format_error(error)
        if isinstance(error, PermanentJobError):
            status, delay = STATUS_DISCARDED, 0.0
        elif job.attempts >= job.max_attempts:
            status, delay = STATUS_FAILED, 0.0
        else:
            status = STATUS_QUEUED
            delay = 0.0 if retry_now else retry_delay_s(job.attempts, self.config.retry_base_s, self.config.retry_cap_s)
        self.completer.failed(Failure(job, status, delay, text[:LAST_ERROR_MAX_CHARS]), time.monotonic() - started)

    # -- maintenance: heartbeats, reaper, pruner --------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_s
        while True:
            await asyncio.sleep(jittered(interval))
            now = time.monotonic()
            # Only jobs older than one interval: a job claimed since the last beat still has at
            # least lease_s - interval >= 2 intervals of lease left (lease_s >= 2 x interval).
            due = [r.job for r in self._running.values() if now - r.started >= interval]
            if not due:
                continue
            try:
                kept = await self._maintenance.jobs_extend_leases(due, self.config.lease_s)
            except StoreError as exc:
                metrics.STORE_ERRORS.labels("heartbeat").inc()
                log.warning("heartbeat for %d jobs failed: %s", len(due), exc)
                continue
            lost = [j.id for j in due if j.id not in kept and j.id in self._running]
            if lost:
                self.stats.leases_lost += len(lost)
                metrics.LEASES_LOST.inc(len(lost))
                log.warning("lost the lease of %d running jobs (taken over): %s", len(lost), lost[:20])

    async def _reaper_loop(self) -> None:
        while True:
            await asyncio.sleep(jittered(self.config.reaper_interval_s))
            try:
                reaped = await self._maintenance.jobs_reap_expired()
                self._sample_pressure(await self._maintenance.db_pressure())
                await self._maintenance.jobs_analyze_if_stale()
            except StoreError as exc:
                metrics.STORE_ERRORS.labels("reap").inc()
                log.warning("reaper failed: %s", exc)
                continue
            if reaped:
                self.stats.reaped += len(reaped)
                metrics.JOBS_REAPED.inc(len(reaped))
                for r in reaped[:20]:
                    log.warning(
                        "lease expired: job %d (attempt %d) held by %s since %s -> %s",
                        r.id, r.attempts, r.locked_by, r.locked_at, r.status,
                    )
                if len(reaped) > 20:
                    log.warning("... and %d more expired leases", len(reaped) - 20)
                self._wakeup.set()

    @staticmethod
    def _sample_pressure(p: Any) -> None:
        if p is None:
            return
        metrics.DB_DEAD_TUPLES.set(p.n_dead_tup)
        metrics.DB_LIVE_TUPLES.set(p.n_live_tup)
        metrics.DB_CLAIM_INDEX_TUPLES_READ.set(p.claim_idx_tup_read)
        metrics.DB_LOCK_WAITS.set(p.lock_waits)

    async def _prune_loop(self) -> None:
        # First prune after a random fraction of the interval, so N pods started together spread out.
        await asyncio.sleep(self.config.prune_interval_s * random.random())
        while True:
            try:
                pruned = await self._maintenance.jobs_prune_finished(self.config.completed_retention_s)
                metrics.JOBS_PRUNED.inc(pruned)
            except StoreError as exc:
                metrics.STORE_ERRORS.labels("prune").inc()
                log.warning("prune failed: %s", exc)
                pruned = 0
            # A full batch means more is waiting: go again soon rather than a whole interval later.
            await asyncio.sleep(0.5 if pruned >= 5000 else jittered(self.config.prune_interval_s))


def _format_error(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).strip()


def _fmt_buckets(buckets: tuple[int, ...] | None) -> str:
    if buckets is None:
        return "none yet (degraded: SKIP LOCKED)"
    return ",".join(map(str, buckets)) if len(buckets) < 12 else f"{len(buckets)} buckets"


def run_worker(config: Config, registry: Registry, *, install_signals: bool = True,
               on_started: Callable[[Worker], None] | None = None) -> Worker:
    """Run a worker on uvloop until SIGTERM/SIGINT; a second signal skips the grace period."""
    import signal

    import uvloop

    worker = Worker(config, registry)

    async def main() -> None:
        if install_signals:
            loop = asyncio.get_running_loop()
            signals_seen = 0

            def on_signal(signum: int) -> None:
                nonlocal signals_seen
                signals_seen += 1
                log.info("received %s: %s", signal.Signals(signum).name,
                         "stopping gracefully" if signals_seen == 1 else "skipping the grace period")
                worker.stop(grace_s=0.0 if signals_seen > 1 else None)

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal, sig)
        if on_started is not None:
            on_started(worker)
        await worker.run()

    uvloop.run(main())
    return worker
