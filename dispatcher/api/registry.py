"""Handler registry: job_type -> function, filled by decorators in the user's app module:
`@registry.handler` (the function receives the `Job`) and `@registry.task` (a typed task: the
function receives the job's arguments, tasks.py)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, ParamSpec, TypeVar

from dispatcher.api.enqueue import EnqueueOptions
from dispatcher.api.enqueue_checks import MAX_PRIORITY, MIN_PRIORITY, check_integer, check_names
from dispatcher.api.schedules.declarations import CATCH_UP_LATEST, Schedule, declare_schedule
from dispatcher.api.schedules.slots import ScheduleError
from dispatcher.api.task_args import TaskArguments
from dispatcher.api.tasks import Task
from dispatcher.backoff import HandlerRetry, RetryFn, handler_retry
from dispatcher.constants import DEFAULT_QUEUE
from dispatcher.observe import tracing

# What a handler's final failure does to its job's ordering key (jobs without a key: nothing).
OnOrderedFailure = Literal["halt", "continue"]
# the key's later jobs wait until an operator retries or cancels this one
ON_ORDERED_FAILURE_HALT: Final = "halt"
ON_ORDERED_FAILURE_CONTINUE: Final = "continue"  # the key's next job runs, as after a success
ON_ORDERED_FAILURE = (ON_ORDERED_FAILURE_HALT, ON_ORDERED_FAILURE_CONTINUE)

# A decorated handler keeps its own signature: type checkers see the function as it was written.
_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class Handler:
    job_type: str
    fn: Callable[..., Any]
    # What the worker calls: `fn` inside its job's span when OpenTelemetry is installed
    # (observe/tracing.py), else `fn` itself. `fn` stays the function as it was registered.
    run: Callable[..., Any]
    is_async: bool
    timeout_s: float | None  # None: the worker's job_timeout_s
    on_ordered_failure: str = ON_ORDERED_FAILURE_HALT
    retry: HandlerRetry | None = None  # its own retry settings; None: the worker's

    @property
    def halts(self) -> bool:
        """Whether a final failure of one of its keyed jobs halts the key."""
        return self.on_ordered_failure == ON_ORDERED_FAILURE_HALT


class Registry:
    """`@registry.handler("send_email")` registers `async def send_email(job)` (or a plain def).

    Async handlers run on the event loop; plain functions run in the worker's thread pool so a
    blocking call never stalls the claim loop. Handlers receive a `dispatcher.Job` and must be
    idempotent: a job whose worker dies mid-run is run again after its lease expires.
    `@registry.task` registers a typed task instead: its function receives the job's arguments.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._schedules: dict[str, Schedule] = {}

    def handler(
        self,
        job_type: str | None = None,
        *,
        timeout_s: float | None = None,
        on_ordered_failure: OnOrderedFailure = ON_ORDERED_FAILURE_HALT,
        max_attempts: int | None = None,
        retry_base_s: float | None = None,
        retry_cap_s: float | None = None,
        retry: RetryFn | None = None,
        schedule: str | None = None,
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        """`on_ordered_failure`: when a job with an ordering key fails for good (out of attempts, or
        discarded), "halt" (the default) keeps the key's later jobs waiting until an operator
        retries or cancels it; "continue" lets the next one run.

        Retries of this handler's failed attempts: `max_attempts` (a job's own, given at enqueue,
        wins), the backoff's `retry_base_s` / `retry_cap_s`, or `retry(attempt, error)` returning
        the seconds before the next attempt (None: the backoff). Unset: the worker's settings.

        `schedule`: a cron expression ("*/5 * * * *", "@hourly"): the short form of
        `registry.schedule(<job_type>, expression, job_type=<job_type>)`: in UTC, in the default
        queue, with an empty payload (registry.schedule for anything else)."""
        own_retry = _checked(
            timeout_s, on_ordered_failure, max_attempts, retry_base_s, retry_cap_s, retry
        )

        def register(fn: Callable[_P, _R]) -> Callable[_P, _R]:
            name = job_type or fn.__name__
            self._add(
                Handler(
                    name,
                    fn,
                    fn,
                    inspect.iscoroutinefunction(fn),
                    timeout_s,
                    on_ordered_failure,
                    own_retry,
                ),
                schedule,
            )
            return fn

        return register

    def task(
        self,
        job_type: str | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        timeout_s: float | None = None,
        on_ordered_failure: OnOrderedFailure = ON_ORDERED_FAILURE_HALT,
        max_attempts: int | None = None,
        retry_base_s: float | None = None,
        retry_cap_s: float | None = None,
        retry: RetryFn | None = None,
        schedule: str | None = None,
    ) -> Callable[[Callable[_P, _R]], Task[_P, _R]]:
        """`@registry.task(queue="emails")` on `async def send_email(to: str, subject: str)` (or a
        plain def): a typed task, registered under `job_type` (default: the function's name). Its
        jobs call the function with the arguments given to `send_email.enqueue(conn, ...)`.

        `queue` and `priority`: its jobs' defaults (`with_options` overrides them per enqueue).
        The other options are `handler`'s; `schedule` enqueues it with no arguments, in `queue`
        at `priority`, so every parameter needs a default. A parameter that cannot be given by
        name (positional-only, `*args`) or whose annotation names a class JSON cannot give back
        (a datetime, a dataclass) is a TypeError here."""
        own_retry = _checked(
            timeout_s, on_ordered_failure, max_attempts, retry_base_s, retry_cap_s, retry
        )
        check_integer("priority", priority, MIN_PRIORITY, MAX_PRIORITY)

        def register(fn: Callable[_P, _R]) -> Task[_P, _R]:
            name = job_type or fn.__name__
            check_names(queue, name)
            arguments = TaskArguments(fn, name)
            if schedule is not None and arguments.required:
                raise ScheduleError(
                    f"task {name!r}: a schedule calls it with no arguments, and "
                    f"{arguments.required[0]!r} has no default"
                )
            is_async = inspect.iscoroutinefunction(fn)
            task = Task(
                fn, name, arguments, is_async, EnqueueOptions(queue=queue, priority=priority)
            )
            handler = Handler(
                name, fn, task.handle, is_async, timeout_s, on_ordered_failure, own_retry
            )
            self._add(handler, schedule, queue, priority)
            return task

        return register

    def _add(
        self,
        handler: Handler,
        schedule: str | None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
    ) -> None:
        """Register `handler` (its `run` wrapped in its job's span when OpenTelemetry is
        installed), and its schedule."""
        name = handler.job_type
        if name in self._handlers:
            raise ValueError(
                f"job_type {name!r} already has a handler: {self._handlers[name].fn!r}"
            )
        if schedule is not None:
            self.schedule(name, schedule, job_type=name, queue=queue, priority=priority)
        self._handlers[name] = replace(handler, run=tracing.traced(handler.run, handler.is_async))

    def schedule(
        self,
        name: str,
        expression: str | None = None,
        *,
        every_s: int | None = None,
        job_type: str,
        payload: Any = None,
        queue: str = DEFAULT_QUEUE,
        tz: str = "UTC",
        priority: int = 0,
        max_attempts: int | None = None,
        catch_up: str = CATCH_UP_LATEST,
    ) -> Schedule:
        """A recurring job: one `job_type` job with `payload` in `queue` at each slot of a 5-field
        cron `expression` read in time zone `tz` (or "@daily", "@hourly", ...), or every `every_s`
        seconds (slots at multiples of it since the Unix epoch). Exactly one job per slot across
        the fleet; `job.scheduled_for` is its slot. `catch_up`: what runs of the slots missed while
        no worker was up: "latest" (the most recent once), "all" (up to CATCH_UP_ALL_MAX), "none".
        Checked here: a ScheduleError names the schedule (docs/concepts/schedules.md)."""
        if name in self._schedules:
            raise ScheduleError(f"schedule {name!r} is declared twice")
        declared = declare_schedule(
            name,
            expression,
            every_s=every_s,
            job_type=job_type,
            payload=payload,
            queue=queue,
            tz=tz,
            priority=priority,
            max_attempts=max_attempts,
            catch_up=catch_up,
        )
        self._schedules[name] = declared
        return declared

    def schedules(self) -> list[Schedule]:
        return [self._schedules[name] for name in sorted(self._schedules)]

    def check_schedules(self) -> None:
        """At the worker's start: every schedule's job type has a handler here."""
        for s in self._schedules.values():
            if s.job_type not in self._handlers:
                raise ScheduleError(
                    f"schedule {s.name!r}: job_type {s.job_type!r} has no handler in this app; "
                    f"handlers: {', '.join(self.job_types()) or 'none'}"
                )

    def get(self, job_type: str) -> Handler | None:
        return self._handlers.get(job_type)

    def halts(self, job_type: str) -> bool:
        """Whether a final failure of a keyed job of this type halts its key (unknown types:
        yes)."""
        handler = self._handlers.get(job_type)
        return handler is None or handler.halts

    def retry_of(self, job_type: str) -> HandlerRetry | None:
        """The handler's own retry settings (None: none, or no handler: the worker's apply)."""
        handler = self._handlers.get(job_type)
        return None if handler is None else handler.retry

    def job_types(self) -> list[str]:
        return sorted(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)


def _checked(
    timeout_s: float | None,
    on_ordered_failure: str,
    max_attempts: int | None,
    retry_base_s: float | None,
    retry_cap_s: float | None,
    retry: RetryFn | None,
) -> HandlerRetry | None:
    """A handler's options checked at decoration (ValueError, TypeError); its own retry
    settings."""
    own_retry = handler_retry(max_attempts, retry_base_s, retry_cap_s, retry)
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError("timeout_s must be > 0")
    if on_ordered_failure not in ON_ORDERED_FAILURE:
        raise ValueError(
            f"on_ordered_failure must be one of {', '.join(ON_ORDERED_FAILURE)}, "
            f"got {on_ordered_failure!r}"
        )
    return own_retry
