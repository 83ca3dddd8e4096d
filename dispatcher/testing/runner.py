"""Run a MemoryStore's jobs with your Registry, synchronously, as a worker would: for unit tests.

Each attempt goes the worker's way (dispatcher/runtime/executor.py): an async handler is awaited
(under its timeout), a plain function runs in a thread; a returned handler completes its job, an
exception goes through the project's RetryPolicy with the handler's own retry settings (a retry
after a backoff, `failed` after max_attempts, `discarded` for PermanentJobError, `failed` at once
for an unknown job type), a `Snooze` queues it again without spending an attempt. No
sleeping: the store's FakeClock stands still while jobs run, and `drain()` advances it to each
retry's run_at. The registry's schedules enqueue a job for each slot the clock reaches
(schedules.py), and `current_job()` answers inside a handler, as on a worker. A handler's
`set_progress` / `update_meta` are written to the store at once (`store.get(id).progress`).
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from dispatcher.api.registry import Handler, Registry
from dispatcher.constants import DEFAULT_QUEUE
from dispatcher.db.rows import Failure
from dispatcher.errors import Cancel, PermanentJobError, Snooze
from dispatcher.model import STATUS_COMPLETED, FailureKind, Job
from dispatcher.observe.job_context import CURRENT_JOB, run_in_job
from dispatcher.runtime.results import encode_result
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.defaults import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_SNOOZES,
    DEFAULT_RETRY_BASE_S,
    DEFAULT_RETRY_CAP_S,
)
from dispatcher.testing.memory_store import MemoryStore
from dispatcher.testing.progress import ProgressLog, reporting
from dispatcher.testing.schedules import RunnerSchedules

T = TypeVar("T")
MAX_JOBS = 10_000  # a drain that runs more attempts than this is a handler enqueueing forever


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt a Runner made: the job, its attempt number, and what the store now holds:
    status 'completed' (under MemoryStore(completed_jobs='delete') the job is gone from the store),
    'queued' (a retry, due at run_at), 'failed', 'discarded' or 'cancelled'."""

    job_id: int
    job_type: str
    attempt: int
    status: str
    kind: FailureKind | None  # how it failed (None: completed)
    error: str | None  # the job's last_error: the traceback, or what went wrong
    snoozed: bool = False  # it raised Snooze within max_snoozes: queued again, no attempt spent


class Runner:
    """Runs due jobs of `store` with `registry`'s handlers.

    `queues`: the queues to run (default: every queue). `retry_base_s`, `retry_cap_s` and `rand`
    are the RetryPolicy's (defaults: the worker's; `rand=lambda: 1.0` makes every backoff its
    bound). `job_timeout_s`: the limit of a handler with no timeout_s of its own (0: none; it is
    real time, as in a worker). `max_snoozes`: DISPATCHER_MAX_SNOOZES. `schedules`: whether the
    registry's schedules enqueue their slots' jobs as the clock moves (from their first slot after
    the store's clock now)."""

    def __init__(
        self,
        store: MemoryStore,
        registry: Registry,
        *,
        queues: list[str] | None = None,
        retry_base_s: float = DEFAULT_RETRY_BASE_S,
        retry_cap_s: float = DEFAULT_RETRY_CAP_S,
        rand: Callable[[], float] = random.random,
        job_timeout_s: float = 0.0,
        lease_s: float = DEFAULT_LEASE_S,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
        schedules: bool = True,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self.store = store
        self.registry = registry
        self.queues = queues
        self.policy = RetryPolicy(retry_base_s, retry_cap_s, rand)
        self.job_timeout_s = job_timeout_s
        self.lease_s = lease_s
        self.max_snoozes = max_snoozes
        self.max_result_bytes = max_result_bytes
        self.attempts: list[Attempt] = []  # every attempt this runner made, in order
        self.schedules = RunnerSchedules(store, registry, queues) if schedules else None

    def advance(self, seconds: float) -> None:
        """Move the store's clock forward: retries and delayed jobs come due without sleeping,
        and each schedule's slots passed get their jobs (run by `run_due`)."""
        self.store.clock.advance(seconds)
        self._enqueue_slots()

    # -- sync: plain tests ---------------------------------------------------------------------

    def run_due(self) -> list[Attempt]:
        """Run every job due now, and those the handlers enqueue due now, until none is; the clock
        stays put, so a retry (always in the future) waits for `advance` or `drain`. The slots the
        clock has reached are enqueued first."""
        return _run(self.arun_due())

    def drain(self, max_jobs: int = MAX_JOBS) -> list[Attempt]:
        """Run until no job is queued, advancing the clock to each next run_at (retries, scheduled
        jobs): every job ends completed, failed, discarded or cancelled. It never moves the clock
        to a schedule's next slot (a schedule has one forever), but enqueues the slots it passes."""
        return _run(self.adrain(max_jobs))

    # -- async: tests that already run an event loop ---------------------------------------------

    async def arun_due(self, max_jobs: int = MAX_JOBS) -> list[Attempt]:
        made: list[Attempt] = []
        self._enqueue_slots()
        while batch := self._claim():
            for job in batch:
                made.append(await self._attempt(job))
                if len(made) > max_jobs:
                    raise RuntimeError(
                        f"ran over {max_jobs} attempts: do handlers enqueue jobs forever?"
                    )
        return made

    async def adrain(self, max_jobs: int = MAX_JOBS) -> list[Attempt]:
        made: list[Attempt] = []
        while True:
            made += await self.arun_due(max_jobs - len(made))
            due = self._next_run_at()
            if due is None:
                return made
            self.store.clock.advance_to(due)

    # -- one attempt ---------------------------------------------------------------------------

    def _queues(self) -> list[str]:
        if self.queues is not None:
            return self.queues
        return sorted(self.store.queues()) or [DEFAULT_QUEUE]

    def _claim(self) -> list[Job]:
        for queue in self._queues():
            if jobs := self.store.claim(queue, 100, self.lease_s).jobs:
                slots = self.schedules
                return jobs if slots is None else [slots.with_slot(job) for job in jobs]
        return []

    def _enqueue_slots(self) -> None:
        if self.schedules is not None:
            self.schedules.enqueue_due()

    def _next_run_at(self) -> datetime | None:
        times = [t for q in self._queues() if (t := self.store.next_run_at(q)) is not None]
        return min(times, default=None)

    async def _attempt(self, job: Job) -> Attempt:
        handler = self.registry.get(job.job_type)
        if handler is None:
            known = ", ".join(self.registry.job_types()) or "none"
            return self._failed(
                job,
                FailureKind.UNKNOWN_TYPE,
                f"no handler registered for job_type {job.job_type!r} (known: {known})",
            )
        try:
            value = await self._call(handler, job)
        except _TimedOut as exc:
            return self._failed(job, FailureKind.TIMEOUT, str(exc))
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
                raise  # the test run itself is being stopped
            return self._raised(job, exc)
        # As the worker's completer: a returned value is stored with the job (bounded as there).
        results = None if value is None else [encode_result(job.id, value, self.max_result_bytes)]
        self.store.complete([job.id], [job.token], results)
        return self._record(job, STATUS_COMPLETED, None, None)

    async def _call(self, handler: Handler, job: Job) -> Any:
        # Reports go to the store at once, fenced by the job's token (a worker batches them).
        with reporting(ProgressLog(lambda report: self.store.report_progress([report]))):
            return await self._run_handler(handler, job)

    async def _run_handler(self, handler: Handler, job: Job) -> Any:
        limit = handler.timeout_s or self.job_timeout_s
        if handler.is_async:
            task = asyncio.ensure_future(_in_job(handler, job))
            done, _ = await asyncio.wait([task], timeout=limit or None)
            if not done:
                task.cancel()
                await asyncio.wait([task])  # let it unwind, as the worker's cancellation does
                raise _TimedOut(f"timed out after {limit:g} s")
            return task.result()
        started = time.monotonic()
        # a thread, as in the worker (thread-locals differ)
        value = await asyncio.to_thread(run_in_job, handler.run, job)
        elapsed = time.monotonic() - started
        if limit and elapsed > limit:
            raise _TimedOut(f"timed out after {limit:g} s (sync handler ran {elapsed:.1f} s)")
        return value

    def _raised(self, job: Job, exc: BaseException) -> Attempt:
        if isinstance(exc, Snooze):  # as the executor: written as a failure only past max_snoozes
            return self._failed(
                job,
                FailureKind.ERROR,
                f"snoozed {self.max_snoozes} times (DISPATCHER_MAX_SNOOZES), and again: {exc}",
                exc,
                (exc.seconds, self.max_snoozes),
            )
        if isinstance(exc, Cancel):  # as the executor: the job ends cancelled, never retried
            return self._failed(job, FailureKind.CANCELLED_BY_HANDLER, str(exc), exc)
        kind = FailureKind.PERMANENT if isinstance(exc, PermanentJobError) else FailureKind.ERROR
        return self._failed(job, kind, "".join(traceback.format_exception(exc)).strip(), exc)

    def _failed(
        self,
        job: Job,
        kind: FailureKind,
        error: str,
        exc: BaseException | None = None,
        snooze: tuple[float, int] | None = None,
    ) -> Attempt:
        outcome = self.policy.decide(
            kind, job.attempts, job.max_attempts, error, self.registry.retry_of(job.job_type), exc
        )
        written = self.store.fail([Failure(job.id, job.token, outcome, snooze=snooze)])
        if written and written[0].snoozed:
            return self._record(job, written[0].status, None, str(exc), snoozed=True)
        return self._record(
            job, written[0].status if written else outcome.status, kind, outcome.error
        )

    def _record(
        self,
        job: Job,
        status: str,
        kind: FailureKind | None,
        error: str | None,
        snoozed: bool = False,
    ) -> Attempt:
        attempt = Attempt(job.id, job.job_type, job.attempts, status, kind, error, snoozed)
        self.attempts.append(attempt)
        return attempt


async def _in_job(handler: Handler, job: Job) -> Any:
    CURRENT_JOB.set(job)  # in the task's own context, as the executor's _run_async
    return await handler.run(job)


class _TimedOut(Exception):
    """A handler overran its time limit (not a TimeoutError it raised itself)."""


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError(
        "an event loop is running here: await runner.arun_due() / runner.adrain() instead"
    )
