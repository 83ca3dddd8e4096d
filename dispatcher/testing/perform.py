"""Run one job's handler here and now, with a `Job` built for it: no store, no retry policy, no
timeout. It returns what the handler returns and raises what it raises (`Snooze` and
`PermanentJobError` included), for a test to assert on.

    perform_job(send_email, "ada@example.com", "Welcome")        # a typed task: its arguments
    perform_job(registry, "send_welcome", {"email": "ada@..."})  # a job type: its payload

The arguments (or payload) go through what enqueue checks and stores, JSON and back, so the
function receives what a worker would give it. `current_job()` answers inside, and the handler's
`set_progress` / `update_meta` are checked and recorded (`recorded_progress()`). A sync handler
runs in the calling thread; `perform_job` runs an async one with asyncio.run, and says to await
`aperform_job` instead where an event loop is running (which runs a sync one in a thread, as a
worker does).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar, overload

import orjson

from dispatcher.api.enqueue import bucket_for
from dispatcher.api.enqueue_checks import serialize_payload
from dispatcher.api.registry import Registry
from dispatcher.api.tasks import Task
from dispatcher.constants import DEFAULT_QUEUE
from dispatcher.model import Job
from dispatcher.observe.job_context import CURRENT_JOB, run_in_job
from dispatcher.settings.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from dispatcher.testing.progress import reporting

P = ParamSpec("P")
T = TypeVar("T")


def _job(
    job_type: str,
    payload: Any = None,
    *,
    job_id: int = 1,
    attempt: int = 1,
    max_attempts: int | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    ordering_key: str | None = None,
    scheduled_for: datetime | None = None,
) -> Job:
    """The Job a worker would hand the handler: the payload stored and read back as JSON."""
    stored = orjson.loads(serialize_payload(payload, DEFAULT_MAX_PAYLOAD_BYTES))
    return Job(
        job_id,
        job_type,
        stored,
        attempt,
        max_attempts,
        datetime.now(UTC),
        0 if ordering_key is None else bucket_for(ordering_key),
        priority,
        ordering_key,
        str(uuid.uuid4()),
        queue,
        scheduled_for,
    )


def _prepared(
    target: Task[Any, Any] | Registry, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Callable[[Job], Any], bool, Job]:
    """The handler's call, whether it is async, and its job."""
    if isinstance(target, Task):
        options = target.options
        job = _job(
            target.job_type,
            target.payload(*args, **kwargs),
            max_attempts=options.get("max_attempts"),
            queue=options.get("queue", DEFAULT_QUEUE),
            priority=options.get("priority", 0),
            ordering_key=options.get("ordering_key"),
        )
        return target.handle, target.is_async, job
    if not isinstance(target, Registry):
        raise TypeError(f"perform_job takes a Task or a Registry, not {type(target).__name__}")
    job = _job(*args, **kwargs)
    handler = target.get(job.job_type)
    if handler is None:
        known = ", ".join(target.job_types()) or "none"
        raise LookupError(f"no handler registered for job_type {job.job_type!r} (known: {known})")
    return handler.run, handler.is_async, job


async def _awaited(call: Callable[[Job], Any], job: Job) -> Any:
    CURRENT_JOB.set(job)  # in this task's own context, as the worker's executor
    return await call(job)


@overload
def perform_job(
    target: Task[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
) -> T: ...
@overload
def perform_job(target: Task[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
@overload
def perform_job(
    target: Registry,
    job_type: str,
    payload: Any = None,
    /,
    *,
    job_id: int = 1,
    attempt: int = 1,
    max_attempts: int | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    ordering_key: str | None = None,
    scheduled_for: datetime | None = None,
) -> Any: ...
def perform_job(target: Task[Any, Any] | Registry, /, *args: Any, **kwargs: Any) -> Any:
    """Run one job of `target` here: a Task with its function's arguments (the job's queue,
    priority, max_attempts and ordering key are the task's options: `task.with_options(...)`), or
    a Registry with a job type and payload, and the Job's fields as keywords (`attempt=3`, ...).
    Returns the handler's result; raises what it raised."""
    call, is_async, job = _prepared(target, args, kwargs)
    if not is_async:
        with reporting():
            return run_in_job(call, job)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with reporting():
            return asyncio.run(_awaited(call, job))
    raise RuntimeError(
        f"an event loop is running here: `await aperform_job(...)` to run {job.job_type!r}"
    )


@overload
async def aperform_job(
    target: Task[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
) -> T: ...
@overload
async def aperform_job(target: Task[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
@overload
async def aperform_job(
    target: Registry,
    job_type: str,
    payload: Any = None,
    /,
    *,
    job_id: int = 1,
    attempt: int = 1,
    max_attempts: int | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    ordering_key: str | None = None,
    scheduled_for: datetime | None = None,
) -> Any: ...
async def aperform_job(target: Task[Any, Any] | Registry, /, *args: Any, **kwargs: Any) -> Any:
    """`perform_job` inside a running event loop: an async handler awaited in a task of its own,
    a sync one in a thread."""
    call, is_async, job = _prepared(target, args, kwargs)
    with reporting():
        if is_async:
            return await asyncio.ensure_future(_awaited(call, job))
        return await asyncio.to_thread(run_in_job, call, job)
