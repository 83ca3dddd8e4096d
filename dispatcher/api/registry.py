"""Handler registry: job_type -> function, filled by a decorator in the user's app module."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dispatcher.backoff import HandlerRetry, RetryFn, handler_retry

# What a handler's final failure does to its job's ordering key (jobs without a key: nothing).
ON_ORDERED_FAILURE_HALT = "halt"  # the key's later jobs wait until an operator retries or cancels this one
ON_ORDERED_FAILURE_CONTINUE = "continue"  # the key's next job runs, as after a success
ON_ORDERED_FAILURE = (ON_ORDERED_FAILURE_HALT, ON_ORDERED_FAILURE_CONTINUE)


@dataclass(frozen=True, slots=True)
class Handler:
    job_type: str
    fn: Callable[..., Any]
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

    def handler(
        self, job_type: str | None = None, *, timeout_s: float | None = None,
        on_ordered_failure: str = ON_ORDERED_FAILURE_HALT, max_attempts: int | None = None,
        retry_base_s: float | None = None, retry_cap_s: float | None = None, retry: RetryFn | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """`on_ordered_failure`: when a job with an ordering key fails for good (out of attempts, or
        discarded), "halt" (the default) keeps the key's later jobs waiting until an operator
        retries or cancels it; "continue" lets the next one run.

        Retries of this handler's failed attempts: `max_attempts` (a job's own, given at enqueue,
        wins), the backoff's `retry_base_s` / `retry_cap_s`, or `retry(attempt, error)` returning
        the seconds before the next attempt (None: the backoff). Unset: the worker's settings."""
        own_retry = handler_retry(max_attempts, retry_base_s, retry_cap_s, retry)
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if on_ordered_failure not in ON_ORDERED_FAILURE:
            raise ValueError(f"on_ordered_failure must be one of {', '.join(ON_ORDERED_FAILURE)}, "
                             f"got {on_ordered_failure!r}")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            name = job_type or fn.__name__
            if name in self._handlers:
                raise ValueError(f"job_type {name!r} already has a handler: {self._handlers[name].fn!r}")
            self._handlers[name] = Handler(name, fn, inspect.iscoroutinefunction(fn), timeout_s, on_ordered_failure,
                                           own_retry)
            return fn

        return register

    def get(self, job_type: str) -> Handler | None:
        return self._handlers.get(job_type)

    def halts(self, job_type: str) -> bool:
        """Whether a final failure of a keyed job of this type halts its key (unknown types: yes)."""
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
