"""Which job the code running now belongs to, for log lines: `job_id`, `job_type`, `queue` and
`attempt` on every line a handler logs, in both formats, whatever logger it uses.

The executor sets `CURRENT_JOB` for the handler's run: inside the task of an async handler (a
task has a context of its own), around the call in the thread of a sync one (`run_in_job`). The
`JobTag` filter on the dispatcher's log handler reads it. Outside a handler it is None, and a
line gets no such field. Its cost for a job that logs nothing: one ContextVar.set.
`current_job()` hands it to code that has no `job` parameter: a typed task's function
(`@registry.task`), or what it calls.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from dispatcher.model import Job

T = TypeVar("T")

CURRENT_JOB: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "dispatcher_current_job", default=None
)
FIELDS = ("job_id", "job_type", "queue", "attempt")


def current_job() -> Job:
    """The job whose handler is running here (a typed task's function has no `job` parameter:
    this is how it reads `attempts`, `scheduled_for`, ...). RuntimeError outside a handler."""
    job: Job | None = CURRENT_JOB.get()
    if job is None:
        raise RuntimeError("current_job() is only known inside a job's handler")
    return job


def run_in_job(fn: Callable[[Any], T], job: Any) -> T:
    """fn(job) with `job` as the current job (a sync handler, in its pool thread): the thread's
    context is reset after, so the next job run there does not inherit it."""
    token = CURRENT_JOB.set(job)
    try:
        return fn(job)
    finally:
        CURRENT_JOB.reset(token)


class JobTag(logging.Filter):
    """Puts the current job's fields on a record logged inside a handler (a handler filter: it
    sees the records of every logger). A field the call passed itself is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = CURRENT_JOB.get()
        if job is not None and not hasattr(record, "job_id"):
            record.job_id = job.id
            record.job_type = job.job_type
            record.queue = job.queue
            record.attempt = job.attempts
        return True
