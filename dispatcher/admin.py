"""The operator's API in one place: the job admin (list, show, retry, cancel, purge: api/admin.py),
the fleet's flow control (limits, paused queues: api/flow.py) and the recurring jobs
(api/schedule_admin.py). `dispatcher jobs`, `dispatcher limits`, `dispatcher queues` and
`dispatcher schedules` are these functions on the command line."""

from dispatcher.api.admin import (
    AdminInputError,
    AdminResult,
    Filters,
    Match,
    cancel_jobs,
    count_jobs,
    job_attempts,
    list_halted_keys,
    list_jobs,
    match_jobs,
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
from dispatcher.api.schedules.listing import ScheduleRow, list_schedules

__all__ = [
    "AdminInputError",
    "AdminResult",
    "Filters",
    "LimitRow",
    "Match",
    "PausedQueue",
    "ScheduleRow",
    "cancel_jobs",
    "clear_limits",
    "count_jobs",
    "job_attempts",
    "list_halted_keys",
    "list_jobs",
    "list_limits",
    "list_schedules",
    "match_jobs",
    "pause_queue",
    "paused_queues",
    "purge_jobs",
    "resume_queue",
    "retry_jobs",
    "set_limit",
    "show_job",
]
