"""Handler registry: job_type -> function, filled by a decorator in the user's app module."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, ParamSpec, TypeVar

from dispatcher.api.schedules.declarations import CATCH_UP_LATEST, Schedule, declare_schedule
from dispatcher.api.schedules.slots import ScheduleError
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
        own_retry = handler_retry(max_attempts, retry_base_s, retry_cap_s, retry)
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if on_ordered_failure not in ON_ORDERED_FAILURE:
            raise ValueError(
                f"on_ordered_failure must be one of {', '.join(ON_ORDERED_FAILURE)}, "
                f"got {on_ordered_failure!r}"
            )

        def register(fn: Callable[_P, _R]) -> Callable[_P, _R]:
            name = job_type or fn.__name__
            if name in self._handlers:
                raise ValueError(
                    f"job_type {name!r} already has a handler: {self._handlers[name].fn!r}"
                )
            if schedule is not None:
                self.schedule(name, schedule, job_type=name)
            is_async = inspect.iscoroutinefunction(fn)
            self._handlers[name] = Handler(
                name,
                fn,
                tracing.traced(fn, is_async),
                is_async,
                timeout_s,
                on_ordered_failure,
                own_retry,
            )
            return fn

        return register

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
