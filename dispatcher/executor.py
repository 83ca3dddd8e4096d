"""The executor: runs claimed jobs and turns every way an attempt can end into an outcome.

    start(jobs)  ->  async handler: a Task on the loop (eager on Python >= 3.12)
                 ->  sync handler: a thread of the pool; the rest wait in a backlog, unstarted
                 ->  no handler: failed at once
    the handler returns             -> completer.completed
    it raises, times out, or is interrupted by shutdown -> RetryPolicy -> completer.failed

A handler can never take the process down: every `BaseException` it raises (SystemExit and
KeyboardInterrupt included) is that job's failure, recorded with its traceback.

Hot path (one Task per job costs ~6 us of client CPU; the whole per-job budget of plain SQL is
~3 us): an async handler that finishes without awaiting runs to completion inside an eagerly
started Task on Python >= 3.12 (0.6 us instead of 6 us), and gets no timer, no `_Running` entry.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import time
import traceback
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .completer import Completer
from .errors import PermanentJobError
from .registry import Handler, Registry
from .retry import FailureKind, RetryPolicy
from .store import Job

log = logging.getLogger(__name__)

_EAGER_TASKS = sys.version_info >= (3, 12)


def _new_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    if _EAGER_TASKS:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    return loop.create_task(coro)


@dataclass(slots=True)
class _Running:
    job: Job
    held_since: float  # time.monotonic() at claim: its lease was set then (see running_since)
    task: asyncio.Task[None] | None = None  # None: a sync handler (backlogged or in a thread)
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class ExecutorStats:
    timeouts: int = 0


class Executor:
    def __init__(self, registry: Registry, policy: RetryPolicy, completer: Completer, *,
                 worker_id: str, job_timeout_s: float, sync_threads: int) -> None:
        self._registry = registry
        self._policy = policy
        self._completer = completer
        self._worker_id = worker_id
        self._job_timeout_s = job_timeout_s
        self._sync_threads = sync_threads
        self._threads = ThreadPoolExecutor(sync_threads, thread_name_prefix="dispatcher-sync")
        self._running: dict[int, _Running] = {}  # jobs that suspended or wait for a thread
        self._sync_backlog: collections.deque[_Running] = collections.deque()
        self._sync_busy = 0
        self._timed_out: set[int] = set()
        self._accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = 0  # claimed and not finished: what the producer's free slots are counted from
        self.slot_freed = asyncio.Event()
        self.stats = ExecutorStats()

    # -- starting ----------------------------------------------------------------------------------

    def start(self, jobs: list[Job]) -> None:
        """Start a claimed batch (called on the event loop)."""
        self.in_flight += len(jobs)
        loop = self._loop or self._bind_loop()
        for job in jobs:
            handler = self._registry.get(job.job_type)
            if handler is None:
                self._unknown_job_type(job)
            elif handler.is_async:
                self._start_async(loop, handler, job)
            else:
                entry = self._running[job.id] = _Running(job, time.monotonic())
                self._sync_backlog.append(entry)
        self._pump_sync()

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _start_async(self, loop: asyncio.AbstractEventLoop, handler: Handler, job: Job) -> None:
        started = time.monotonic()
        task = _new_task(loop, self._run_async(handler, job, started))
        if task.done():
            return  # finished without awaiting: outcome already buffered, slot already freed
        entry = self._running[job.id] = _Running(job, started, task)
        timeout_s = self._timeout_of(handler)
        if timeout_s:
            entry.timer = loop.call_later(timeout_s, self._time_out, entry)

    async def _run_async(self, handler: Handler, job: Job, started: float) -> None:
        try:
            await handler.fn(job)
        except asyncio.CancelledError:
            if job.id in self._timed_out:
                self._timed_out.discard(job.id)
                self._fail(job, FailureKind.TIMEOUT, f"timed out after {self._timeout_of(handler):g} s", started)
            else:
                self._fail(job, FailureKind.INTERRUPTED, "interrupted: worker shut down", started)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a handler is its job's failure
            self._fail_with(job, exc, started)
        else:
            self._completer.completed(job, time.monotonic() - started)
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
        while self._sync_backlog and self._sync_busy < self._sync_threads and self._accepting:
            entry = self._sync_backlog.popleft()
            handler = self._registry.get(entry.job.job_type)
            assert handler is not None and loop is not None
            self._sync_busy += 1
            started = time.monotonic()
            future = loop.run_in_executor(self._threads, handler.fn, entry.job)
            future.add_done_callback(lambda f, e=entry, h=handler, s=started: self._sync_done(f, e, h, s))

    def _sync_done(self, future: asyncio.Future[Any], entry: _Running, handler: Handler, started: float) -> None:
        self._sync_busy -= 1
        if self._running.pop(entry.job.id, None) is not None:  # not already given up by shutdown
            limit = self._timeout_of(handler)
            elapsed = time.monotonic() - started
            exc = None if future.cancelled() else future.exception()
            if limit and elapsed > limit:
                # A thread cannot be interrupted; an overrun is recorded as a timeout when it returns
                # (its lease was kept alive meanwhile, so it never ran twice at once).
                self.stats.timeouts += 1
                self._fail(entry.job, FailureKind.TIMEOUT,
                           f"timed out after {limit:g} s (sync handler ran {elapsed:.1f} s)", started)
            elif exc is not None:
                self._fail_with(entry.job, exc, started)
            else:
                self._completer.completed(entry.job, elapsed)
            self._finish_slot()
        self._pump_sync()

    # -- outcomes ------------------------------------------------------------------------------------

    def _unknown_job_type(self, job: Job) -> None:
        known = ", ".join(self._registry.job_types()) or "none"
        message = f"no handler registered for job_type {job.job_type!r} in worker {self._worker_id} (known: {known})"
        self._fail(job, FailureKind.UNKNOWN_TYPE, message, time.monotonic())
        self._finish_slot()

    def _fail_with(self, job: Job, exc: BaseException, started: float) -> None:
        kind = FailureKind.PERMANENT if isinstance(exc, PermanentJobError) else FailureKind.ERROR
        self._fail(job, kind, "".join(traceback.format_exception(exc)).strip(), started)

    def _fail(self, job: Job, kind: FailureKind, error: str, started: float) -> None:
        outcome = self._policy.decide(kind, job.attempts, job.max_attempts, error)
        self._completer.failed(job, outcome, time.monotonic() - started)

    def _finish_slot(self) -> None:
        self.in_flight -= 1
        self.slot_freed.set()

    def _timeout_of(self, handler: Handler) -> float:
        return handler.timeout_s or self._job_timeout_s

    # -- for the lease keeper and the shutdown ----------------------------------------------------------

    def running_since(self, cutoff: float) -> list[Job]:
        """Jobs held since time.monotonic() <= cutoff: the ones whose lease needs extending."""
        return [r.job for r in self._running.values() if r.held_since <= cutoff]

    def holds(self, job_id: int) -> bool:
        return job_id in self._running

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

    async def drain(self, grace_s: float) -> None:
        """Let running jobs finish within `grace_s`, then interrupt what is left."""
        deadline = time.monotonic() + grace_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            self.slot_freed.clear()
            try:
                await asyncio.wait_for(self.slot_freed.wait(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        leftover = [r.task for r in self._running.values() if r.task is not None and not r.task.done()]
        if leftover:
            log.warning("grace period over: interrupting %d running jobs", len(leftover))
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
        # Sync handlers cannot be interrupted; whatever still runs in a thread is given back as an
        # interrupted attempt, and its late result (if the process lives on) is fenced.
        for entry in list(self._running.values()):
            if entry.task is None:
                del self._running[entry.job.id]
                self._fail(entry.job, FailureKind.INTERRUPTED, "interrupted: worker shut down while a sync handler ran",
                           entry.held_since)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
