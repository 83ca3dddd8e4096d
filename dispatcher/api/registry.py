"""Handler registry: job_type -> function, filled by a decorator in the user's app module."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Handler:
    job_type: str
    fn: Callable[..., Any]
    is_async: bool
    timeout_s: float | None  # None: the worker's job_timeout_s


class Registry:
    """`@registry.handler("send_email")` registers `async def send_email(job)` (or a plain def).

    Async handlers run on the event loop; plain functions run in the worker's thread pool so a
    blocking call never stalls the claim loop. Handlers receive a `dispatcher.Job` and must be
    idempotent: a job whose worker dies mid-run is run again after its lease expires.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(
        self, job_type: str | None = None, *, timeout_s: float | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            name = job_type or fn.__name__
            if name in self._handlers:
                raise ValueError(f"job_type {name!r} already has a handler: {self._handlers[name].fn!r}")
            self._handlers[name] = Handler(name, fn, inspect.iscoroutinefunction(fn), timeout_s)
            return fn

        return register

    def get(self, job_type: str) -> Handler | None:
        return self._handlers.get(job_type)

    def job_types(self) -> list[str]:
        return sorted(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)
