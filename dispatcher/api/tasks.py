"""Typed tasks: `@registry.task` turns a function into a `Task`, whose `enqueue` takes the
function's own parameters, checked by the type checker at the call site and by task_args.py at
run time, and whose job runs the function with them.

    @registry.task(queue="emails", max_attempts=5)
    async def send_email(to: str, subject: str, cc: list[str] | None = None) -> None: ...

    await send_email.enqueue(conn, "ada@example.com", "Welcome")
    send_email.with_options(delay_s=60, dedupe_key="welcome:42").enqueue_sync(conn, "a@b", "Hi")

A ParamSpec cannot take extra keywords beside the function's, so the job's options (queue, delay,
keys...) go through `with_options`, which returns a Task with those options.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, Unpack

from dispatcher.api.enqueue import (
    AsyncTarget,
    EnqueueOptions,
    JobSpec,
    SyncTarget,
    enqueue,
    enqueue_sync,
)
from dispatcher.api.results import JobHandle
from dispatcher.api.task_args import TaskArguments
from dispatcher.model import Job

P = ParamSpec("P")
R = TypeVar("R", covariant=True)  # only ever returned: a Task[P, bool] is a Task[P, object]

OPTIONS = frozenset(EnqueueOptions.__annotations__)


class Task(Generic[P, R]):
    """A registered typed task (`@registry.task`). Calling it calls the function itself;
    `enqueue` / `enqueue_sync` enqueue a job that calls it on a worker, with the arguments given
    (checked first: an `EnqueueError` naming the parameter, and nothing written); `spec` is such
    a job for `enqueue_many`; `with_options` gives the same task with job options set.

    `job_type` is the name its jobs carry; `options` the job options its enqueues use (those of
    the decorator, then of `with_options`)."""

    def __init__(
        self,
        fn: Callable[P, R],
        job_type: str,
        arguments: TaskArguments,
        is_async: bool,
        options: EnqueueOptions,
    ) -> None:
        self.fn = fn
        self.job_type = job_type
        self.is_async = is_async
        self._arguments = arguments
        self._options = options
        functools.update_wrapper(self, fn)  # its name, docstring and signature, for tools

    @property
    def options(self) -> EnqueueOptions:
        return EnqueueOptions(**self._options)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The function itself, here and now (an async one's coroutine): no job."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.job_type!r} of {self.fn!r}>"

    def with_options(self, **options: Unpack[EnqueueOptions]) -> Task[P, R]:
        """This task with job options set (over the decorator's and earlier ones): queue,
        priority, run_at or delay_s, jitter_s, max_attempts, partition_key or bucket,
        ordering_key, dedupe_key, dedupe_window_s, tags, depends_on, on_parent_failure, as
        `enqueue` takes them. Checked when a job is enqueued; an unknown name is a TypeError
        here."""
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise TypeError(
                f"with_options() got unknown job options {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(OPTIONS))}"
            )
        other = copy.copy(self)
        other._options = EnqueueOptions(**{**self._options, **options})
        return other

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The payload a job of these arguments carries: the arguments given, by parameter name
        (for `registry.schedule(..., payload=...)` and assertions)."""
        return self._arguments.payload(args, kwargs)

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec:
        """A job of these arguments, with this task's options, for `enqueue_many`."""
        return JobSpec(self.job_type, self._arguments.payload(args, kwargs), **self._options)

    async def enqueue(
        self, target: AsyncTarget, /, *args: P.args, **kwargs: P.kwargs
    ) -> JobHandle | None:
        """Enqueue a job that calls the function with these arguments, as `dispatcher.enqueue`
        does (a connection: in its transaction; a pool: committed). Returns the job's id, or None
        when its dedupe key is held."""
        payload = self._arguments.payload(args, kwargs)
        return await enqueue(target, self.job_type, payload, **self._options)

    def enqueue_sync(
        self, target: SyncTarget, /, *args: P.args, **kwargs: P.kwargs
    ) -> JobHandle | None:
        """`enqueue` for sync code: as `dispatcher.enqueue_sync`."""
        payload = self._arguments.payload(args, kwargs)
        return enqueue_sync(target, self.job_type, payload, **self._options)

    def handle(self, job: Job) -> R:
        """What its registered handler calls: the function with `job.payload`'s keys as its
        arguments (an async function's coroutine, for the caller to await)."""
        result: R = self._arguments.call(job.payload)
        return result
