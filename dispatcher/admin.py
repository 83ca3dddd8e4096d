"""The operator's API in one place: the job admin (list, show, retry, cancel, purge: api/admin.py)
and the fleet's flow control (limits, paused queues: api/flow.py). `dispatcher jobs`, `dispatcher
limits` and `dispatcher queues` are these functions on the command line."""

from dispatcher.api.admin import (
    AdminInputError,
    AdminResult,
    Filters,
    cancel_jobs,
    count_jobs,
    job_attempts,
    list_halted_keys,
    list_jobs,
    purge_jobs,
    retry_jobs,
    show_job,
)
from dispatcher.api.flow import (
    LimitRow,
    PausedQueue,
    clear_limits,
    list_limits,
    pause_queue,
    paused_queues,
    resume_queue,
    set_limit,
)

__all__ = [
    "AdminInputError", "AdminResult", "Filters", "LimitRow", "PausedQueue", "cancel_jobs", "clear_limits",
    "count_jobs", "job_attempts", "list_halted_keys", "list_jobs", "list_limits", "pause_queue", "paused_queues",
    "purge_jobs", "resume_queue", "retry_jobs", "set_limit", "show_job",
]
