"""The executor: runs claimed jobs and turns every way an attempt can end into an outcome.

Async handlers run as Tasks (eager on Python >= 3.12), sync ones in the thread pool; a missing
handler fails at once. Returns go to the completer; errors, timeouts and interruptions go through
the RetryPolicy; an operator's cancel wins. No `BaseException` of a handler takes the process
down. Hot-path costs: docs/design/worker.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dispatcher.api.registry import Handler, Registry
from dispatcher.errors import Cancel, PermanentJobError, Snooze
from dispatcher.model import PROGRESS_SINK, FailureKind, Job, ProgressSink
from dispatcher.observe import metrics
from dispatcher.observe.job_context import CURRENT_JOB, run_in_job
from dispatcher.observe.job_metrics import JOB_STATS, JobStats
from dispatcher.runtime.completer import Completer
from dispatcher.runtime.held_jobs import (
    LOST_ACTIONS,
    RAN_OUT,
    TAKEN_OVER,
    ExecutorStats,
    Running,
    State,
    new_task,
    running_by_queue,
)
from dispatcher.runtime.joblog import exception_line
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.runtime.unserved import Unserved
from dispatcher.settings.sections import ExecutionSettings, LeaseSettings

log = logging.getLogger(__name__)


class Executor:
    def __init__(
        self,
        registry: Registry,
        policy: RetryPolicy,
        completer: Completer,
        execution: ExecutionSettings,
        leases: LeaseSettings,
        *,
        job_stats: JobStats = JOB_STATS,
        clock: Callable[[], float] = time.monotonic,
        served_lately: Callable[[str], bool | None] | None = None,
        progress: ProgressSink | None = None,
    ) -> None:
        """`served_lately(job_type)`: whether any worker served the type lately (the registry:
        runtime/presence.py); without it, jobs of a type with no handler here are only handed
        back, never discarded. `progress`: where sync handlers' reports go (async ones find it in
        the context the worker set)."""
        self._registry = registry
        self._unserved = Unserved(
            execution.worker_id,
            registry.job_types,
            execution.unserved_type_discard_s,
            served_lately or (lambda job_type: None),
            clock,
        )
        # Seconds, monotonic: leases, durations and every time argument below are on it (tests: a
        # FakeClock).
        self._clock = clock
        self._job_stats = job_stats
        self._policy = policy
        self._completer = completer
        self._worker_id = execution.worker_id
        self._job_timeout_s = execution.job_timeout_s
        self._max_snoozes = execution.max_snoozes
        self._sync_threads = sync_threads = execution.sync_threads
        self._lease_s = leases.lease_s
        # A backlogged sync job starts only with this much of its lease left: a thread cannot be
        # stopped, so one started on a lease about to lapse could run beside its re-run.
        self._start_margin_s = leases.start_margin_s
        # A job whose lease (as we last extended it) is about to run out is stopped this long
        # before: its lease may be taken over the moment it ends. Only happens when heartbeats
        # stopped reaching the database; a healthy heartbeat keeps every lease well ahead.
        self._lose_early_s = leases.lose_early_s
        self._lease_watch: asyncio.TimerHandle | None = None
        self._threads = ThreadPoolExecutor(
            sync_threads,
            thread_name_prefix="dispatcher-sync",
            # in each thread's context once, never per job (model.PROGRESS_SINK)
            initializer=PROGRESS_SINK.set,
            initargs=(progress,),
        )
        self._running: dict[int, Running] = {}  # jobs that suspended or wait for a thread
        self._sync_backlog: collections.deque[Running] = collections.deque()
        self._sync_busy = 0
        self._timed_out: set[int] = set()
        self._starting: Job | None = None
        self._accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        # claimed and not finished: what the producer's free slots are counted from
        self.in_flight = 0
        self.slot_freed = asyncio.Event()
        self.stats = ExecutorStats()

    # -- starting ----------------------------------------------------------------------------------

    def start(self, jobs: list[Job], claimed_at: float | None = None) -> None:
        """Start a claimed batch (called on the event loop). `claimed_at`: the clock's time when
        the claim statement was sent, from which the lease is counted (default: now)."""
        self.in_flight += len(jobs)
        loop = self._loop or self._bind_loop()
        held_since = self._clock() if claimed_at is None else claimed_at
        lease_until = held_since + self._lease_s
        for job in jobs:
            handler = self._registry.get(job.job_type)
            if handler is None:
                self._unknown_job_type(job)
            elif handler.is_async:
                self._start_async(loop, handler, job, held_since, lease_until)
            else:
                entry = self._running[job.id] = Running(
                    job, held_since, lease_until, state=State.BACKLOG
                )
                self._sync_backlog.append(entry)
        self._pump_sync()
        if self._lease_watch is None and self._running:
            self._watch_leases()

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _start_async(
        self,
        loop: asyncio.AbstractEventLoop,
        handler: Handler,
        job: Job,
        held_since: float,
        lease_until: float,
    ) -> None:
        started = self._clock()
        # running inside the eager start: not in _running yet (running_by_queue)
        self._starting = job
        task = new_task(loop, self._run_async(handler, job, started))
        self._starting = None
        if task.done():
            return  # finished without awaiting: outcome already buffered, slot already freed
        entry = self._running[job.id] = Running(job, held_since, lease_until, task)
        timeout_s = self._timeout_of(handler)
        if timeout_s:
            entry.timeout_at = started + timeout_s
            entry.timer = loop.call_later(timeout_s, self._time_out, entry)

    async def _run_async(self, handler: Handler, job: Job, started: float) -> None:
        CURRENT_JOB.set(job)  # in this task's own context: its log lines carry the job's fields
        try:
            value = await handler.run(job)
        except asyncio.CancelledError:
            entry = self._running.get(job.id)
            if entry is not None and entry.state is State.LOST:
                pass  # its lease is gone: the new owner decides; nothing of ours may be written
            elif entry is not None and entry.cancelling:
                self._cancelled(job, "the handler was interrupted", started)
            elif job.id in self._timed_out:
                self._timed_out_failure(handler, job, started)
            else:
                self._fail(job, FailureKind.INTERRUPTED, "interrupted: worker shut down", started)
        except BaseException as exc:
            if self._cancelling(job):  # e.g. it turned the cancellation into an error of its own
                self._cancelled(job, f"the handler then raised {type(exc).__name__}", started)
            else:
                self._fail_with(job, exc, started)
        else:
            # it swallowed the cancellation and returned: cancelled all the same
            if self._cancelling(job):
                self._cancelled(job, "the handler returned anyway", started)
            # it swallowed the cancellation and returned: still an overrun
            elif job.id in self._timed_out:
                self._timed_out_failure(handler, job, started)
            else:
                self._completer.completed(job, self._clock() - started, value)
        finally:
            self._timed_out.discard(job.id)
            entry = self._running.pop(job.id, None)
            if entry is not None and entry.timer is not None:
                entry.timer.cancel()
            self._finish_slot()

    def _timed_out_failure(self, handler: Handler, job: Job, started: float) -> None:
        self._fail(
            job, FailureKind.TIMEOUT, f"timed out after {self._timeout_of(handler):g} s", started
        )

    def _time_out(self, entry: Running) -> None:
        if entry.task is not None and not entry.task.done():
            self.stats.timeouts += 1
            self._job_stats.timed_out(entry.job.queue, entry.job.job_type)
            self._timed_out.add(entry.job.id)
            entry.task.cancel()

    def _pump_sync(self) -> None:
        """Hand backlogged sync jobs to free threads; the rest wait here, claimed but unstarted."""
        loop = self._loop
        expiring: list[int] = []
        while self._sync_backlog and self._sync_busy < self._sync_threads and self._accepting:
            entry = self._sync_backlog[0]
            if entry.lease_until - self._clock() < self._start_margin_s:
                # Our heartbeats have not reached the database for a while (else the lease would
                # have been extended): another worker may own it by now. Never start it here.
                expiring.append(entry.job.id)
                self._lose(entry)  # pops it from the backlog
                continue
            self._sync_backlog.popleft()
            handler = self._registry.get(entry.job.job_type)
            assert handler is not None and loop is not None
            self._sync_busy += 1
            entry.state = State.RUNNING
            started = self._clock()
            entry.timeout_at = started + limit if (limit := self._timeout_of(handler)) else None
            future = loop.run_in_executor(self._threads, run_in_job, handler.run, entry.job)
            future.add_done_callback(functools.partial(self._sync_done, entry, handler, started))
        if expiring:
            self._count_lost(RAN_OUT, len(expiring))
            log.warning(
                "lost the lease of %d backlogged jobs (it ran out before a thread was free, while "
                "heartbeats failed): dropped before they started; ids %s",
                len(expiring),
                expiring[:20],
                extra={"lost_jobs": len(expiring), "job_ids": expiring[:20]},
            )

    def _sync_done(
        self, entry: Running, handler: Handler, started: float, future: asyncio.Future[Any]
    ) -> None:
        self._sync_busy -= 1
        self._running.pop(entry.job.id, None)
        if entry.state is State.RUNNING:
            limit = self._timeout_of(handler)
            elapsed = self._clock() - started
            exc = None if future.cancelled() else future.exception()
            if entry.cancelling:  # recorded when it returns, however it ended
                self._cancelled(
                    entry.job,
                    "the sync handler ran to its end (a thread cannot be interrupted)",
                    started,
                )
            elif limit and elapsed > limit:
                # A thread cannot be interrupted; an overrun is recorded as a timeout when it
                # returns (its lease was kept alive meanwhile, so it never ran twice at once).
                self.stats.timeouts += 1
                self._job_stats.timed_out(entry.job.queue, entry.job.job_type)
                self._fail(
                    entry.job,
                    FailureKind.TIMEOUT,
                    f"timed out after {limit:g} s (sync handler ran {elapsed:.1f} s)",
                    started,
                )
            elif exc is not None:
                self._fail_with(entry.job, exc, started)
            else:
                self._completer.completed(entry.job, elapsed, future.result())
        self._finish_slot()
        self._pump_sync()

    # -- outcomes ----------------------------------------------------------------------------------

    def _unknown_job_type(self, job: Job) -> None:
        # Never a failure: during a rollout the type's handler is on the newer pods (unserved.py).
        self._completer.handed_back(self._unserved.hand_back(job))
        self._finish_slot()

    def _fail_with(self, job: Job, exc: BaseException, started: float) -> None:
        if isinstance(exc, Cancel):  # the handler's own decision: not a failure
            self._fail(job, FailureKind.CANCELLED_BY_HANDLER, str(exc), started, summary=str(exc))
            return
        # not a failure: this outcome is written only past the snooze cap
        if isinstance(exc, Snooze):
            self._fail(
                job,
                FailureKind.ERROR,
                f"snoozed {self._max_snoozes} times (DISPATCHER_MAX_SNOOZES), and again: {exc}",
                started,
                summary=str(exc),
                exc=exc,
                snooze=(exc.seconds, self._max_snoozes),
            )
            return
        kind = FailureKind.PERMANENT if isinstance(exc, PermanentJobError) else FailureKind.ERROR
        self._fail(
            job,
            kind,
            "".join(traceback.format_exception(exc)).strip(),
            started,
            summary=exception_line(exc),
            exc=exc,
        )

    def _fail(
        self,
        job: Job,
        kind: FailureKind,
        error: str,
        started: float,
        summary: str | None = None,
        exc: BaseException | None = None,
        snooze: tuple[float, int] | None = None,
    ) -> None:
        outcome = self._policy.decide(
            kind, job.attempts, job.max_attempts, error, self._registry.retry_of(job.job_type), exc
        )
        halts = job.ordering_key is None or self._registry.halts(job.job_type)
        self._completer.failed(
            job,
            outcome,
            self._clock() - started,
            kind=kind,
            summary=summary,
            halts=halts,
            snooze=snooze,
        )

    def _cancelling(self, job: Job) -> bool:
        entry = self._running.get(job.id)
        return entry is not None and entry.cancelling and entry.state is not State.LOST

    def _cancelled(self, job: Job, how: str, started: float) -> None:
        self._fail(
            job,
            FailureKind.CANCELLED,
            f"cancelled: an operator asked (dispatcher jobs cancel); {how}",
            started,
        )

    def _finish_slot(self) -> None:
        self.in_flight -= 1
        self.slot_freed.set()

    def _timeout_of(self, handler: Handler) -> float:
        return handler.timeout_s or self._job_timeout_s

    def running_by_queue(self) -> dict[str, int]:
        """Jobs whose handler runs now, by queue; for a scrape, from the HTTP server's thread (an
        async handler inside its eager start counts too). dict.copy() is one C call: atomic under
        the GIL, so the loop may go on meanwhile."""
        return running_by_queue(list(self._running.copy().values()), self._starting)

    def held(self) -> list[Running]:
        """Jobs whose handler runs now (started, not finished): what the stuck watch reads
        (stuck.py)."""
        return [r for r in self._running.values() if r.state is not State.BACKLOG]

    # -- leases: for the lease keeper --------------------------------------------------------------

    def running_since(self, cutoff: float) -> list[Job]:
        """Jobs held since the clock's time <= cutoff whose lease is still ours: the ones to
        extend."""
        return [
            r.job
            for r in self._running.values()
            if r.held_since <= cutoff and r.state in (State.RUNNING, State.BACKLOG)
        ]

    def extended(self, ids: Iterable[int], lease_until: float) -> None:
        """Their leases were extended by a statement sent at lease_until - lease_s."""
        for job_id in ids:
            entry = self._running.get(job_id)
            if entry is not None:
                entry.lease_until = max(entry.lease_until, lease_until)
        self._watch_leases()

    def _watch_leases(self) -> None:
        """(Re)arm one timer for the earliest lease end among the jobs we hold: when it fires,
        whatever is about to run out is lost (see _lose_early_s). One timer, re-armed per
        heartbeat, not one per job."""
        if self._lease_watch is not None:
            self._lease_watch.cancel()
            self._lease_watch = None
        ends = [
            r.lease_until
            for r in self._running.values()
            if r.state in (State.RUNNING, State.BACKLOG)
        ]
        if ends and self._loop is not None:
            delay = min(ends) - self._lose_early_s - self._clock()
            self._lease_watch = self._loop.call_later(max(0.0, delay), self._lease_watch_fired)

    def _lease_watch_fired(self) -> None:
        self._lease_watch = None
        self.lose_expired(self._clock() + self._lose_early_s)
        self._watch_leases()

    def cancel(self, ids: Iterable[int]) -> int:
        """An operator asked to cancel these jobs (read with a heartbeat): an async handler is
        cancelled now, an unstarted sync job never starts, a sync handler's thread (it cannot be
        stopped) keeps its lease until it returns. Each ends 'cancelled', never retried. Returns
        how many began to."""
        entries = [
            e
            for i in ids
            if (e := self._running.get(i)) is not None
            and not e.cancelling
            and e.state in (State.RUNNING, State.BACKLOG)
        ]
        for entry in entries:
            entry.cancelling = True
            if entry.state is State.BACKLOG:
                with contextlib.suppress(ValueError):
                    self._sync_backlog.remove(entry)
                self._running.pop(entry.job.id, None)
                self._cancelled(entry.job, "it had not started", self._clock())
                self._finish_slot()
            elif entry.task is not None:
                entry.task.cancel()
        if entries:
            log.info(
                "cancelling %d jobs at an operator's request: %s",
                len(entries),
                [e.job.id for e in entries[:20]],
            )
        return len(entries)

    def lose(self, ids: Iterable[int], why: str, reason: str = TAKEN_OVER) -> int:
        """These leases are no longer ours (`why`; `reason`: TAKEN_OVER or RAN_OUT, for
        dispatcher_leases_lost_total): nothing of these jobs may start or be written here any
        more. Returns how many we still held."""
        entries = [
            e
            for i in ids
            if (e := self._running.get(i)) is not None and e.state in (State.RUNNING, State.BACKLOG)
        ]
        if not entries:
            return 0
        actions = collections.Counter(self._lose(entry) for entry in entries)
        self._count_lost(reason, len(entries))
        ids = [e.job.id for e in entries[:20]]
        log.warning(
            "lost the lease of %d jobs (%s): %s; ids %s",
            len(entries),
            why,
            ", ".join(f"{n} {LOST_ACTIONS[a]}" for a, n in actions.items()),
            ids,
            extra={"lost_jobs": len(entries), "job_ids": ids, "actions": dict(actions)},
        )
        return len(entries)

    def lose_expired(self, now: float) -> int:
        """Leases that end by `now` (as we last extended them) are lost: our heartbeats did not
        reach the database, and another worker may run these jobs once they end. Returns how
        many."""
        return self.lose(
            [r.job.id for r in self._running.values() if r.lease_until <= now],
            "it ran out while our heartbeats did not reach the database",
            RAN_OUT,
        )

    def _count_lost(self, reason: str, n: int) -> None:
        """`n` leases lost for `reason`: the stop line's counters and the metric, once a batch."""
        if reason == RAN_OUT:
            self.stats.leases_ran_out += n
        else:
            self.stats.leases_taken_over += n
        metrics.LEASES_LOST.labels(reason).inc(n)

    def _lose(self, entry: Running) -> str:
        """Stop what can be stopped of a job whose lease is gone; returns what was done."""
        if entry.state is State.BACKLOG:
            with contextlib.suppress(ValueError):
                self._sync_backlog.remove(entry)
            self._running.pop(entry.job.id, None)
            entry.state = State.LOST
            self.stats.lost_dropped += 1
            action = "dropped_unstarted"
            self._finish_slot()
        elif entry.task is not None:
            entry.state = State.LOST
            self.stats.lost_cancelled += 1
            action = "cancelled"
            entry.task.cancel()
        else:  # a thread cannot be stopped: it finishes, and its outcome is not written
            entry.state = State.LOST
            self.stats.lost_running += 1
            action = "left_running_sync"
        metrics.LOST_LEASE_JOBS.labels(action).inc()
        return action

    # -- shutdown ----------------------------------------------------------------------------------

    def stop_starting(self) -> None:
        """Shutdown has begun: backlogged sync jobs stay unstarted, to be given back."""
        self._accepting = False

    def take_unstarted(self) -> list[Job]:
        """Hand back the sync backlog (claimed, never started); nothing more starts."""
        self._accepting = False
        unstarted = [r.job for r in self._sync_backlog]
        self._sync_backlog.clear()
        for job in unstarted:
            del self._running[job.id]
            self._finish_slot()
        return unstarted

    async def drain(self, deadline: float, stuck: Callable[[], int] = lambda: 0) -> None:
        """Let running jobs finish until the clock reaches `deadline`, or only `stuck()` are left
        (stuck.py)."""
        while self.in_flight > stuck() and self._clock() < deadline:
            self.slot_freed.clear()
            try:
                await asyncio.wait_for(
                    self.slot_freed.wait(), timeout=max(0.0, deadline - self._clock())
                )
            except TimeoutError:
                break

    async def interrupt(self, wait_s: float) -> int:
        """The grace period is over: cancel async handlers (their attempts are retried at once)
        and wait up to `wait_s` for them and for sync handlers, whose threads cannot be stopped.

        A sync job is never given back while its thread runs (another worker would run it beside
        it): it keeps its lease (the lease keeper still runs) and its outcome is written if it
        returns in time. Returns how many jobs are still running after `wait_s`, abandoned: the
        caller must end the process without waiting for them, and their leases bring them back."""
        tasks = [r.task for r in self._running.values() if r.task is not None and not r.task.done()]
        threads = sum(r.task is None and r.state is State.RUNNING for r in self._running.values())
        if tasks or threads:
            log.warning(
                "grace period over: interrupting %d async handlers; %d sync handlers cannot be "
                "interrupted and keep their leases for up to %.0f s more",
                len(tasks),
                threads,
                wait_s,
            )
        for task in tasks:
            task.cancel()
        await self.drain(self._clock() + wait_s)
        left = [r for r in self._running.values() if r.state is State.RUNNING]
        for entry in left:
            entry.state = State.ABANDONED  # no outcome, no more heartbeats: its lease lapses
        if left:
            log.error(
                "%d handlers still run after the grace period and %.0f s more (async ones ignore "
                "cancellation, sync ones never return): leaving them to their leases: %s",
                len(left),
                wait_s,
                [e.job.id for e in left[:20]],
            )
        return len(left)

    def close(self) -> None:
        if self._lease_watch is not None:
            self._lease_watch.cancel()
            self._lease_watch = None
        self._threads.shutdown(wait=False, cancel_futures=True)
