"""bucket-dispatcher: a high-throughput background-job dispatcher on PostgreSQL.

    from dispatcher import Registry, enqueue

    registry = Registry()

    @registry.handler("send_email")
    async def send_email(job):
        ...

    @registry.task(queue="reports")              # a typed task: enqueue takes its arguments
    def build_report(customer_id: int, full: bool = False) -> None:
        ...

    build_report.enqueue_sync(conn, 42, full=True)

Run workers with `dispatcher run --app myapp.jobs:registry`.
"""

from dispatcher import _libpq  # noqa: F401  # first: psycopg without libpq fails here, in one line
from dispatcher._version import __version__ as __version__
from dispatcher.api.enqueue import (
    JobSpec,
    enqueue,
    enqueue_many,
    enqueue_many_sync,
    enqueue_payloads,
    enqueue_payloads_sync,
    enqueue_sync,
)
from dispatcher.api.registry import Registry
from dispatcher.api.results import JobHandle
from dispatcher.api.schedules.declarations import Schedule
from dispatcher.api.schedules.slots import ScheduleError
from dispatcher.api.tasks import Task
from dispatcher.api.workflows import (
    BatchIds,
    Workflow,
    enqueue_batch,
    enqueue_batch_sync,
    enqueue_workflow,
    enqueue_workflow_sync,
)
from dispatcher.errors import (
    Cancel,
    ConfigError,
    DispatcherError,
    EnqueueError,
    JobFailed,
    JobNotFound,
    PayloadError,
    PermanentJobError,
    ProgressError,
    SchemaMissing,
    Snooze,
    StoreConflict,
    StoreError,
    StorePermissionDenied,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)
from dispatcher.model import Job
from dispatcher.observe.job_context import current_job
from dispatcher.serve.worker import Worker, run_worker
from dispatcher.settings.config import Config

__all__ = [
    "BatchIds",
    "Cancel",
    "Config",
    "ConfigError",
    "DispatcherError",
    "EnqueueError",
    "Job",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "JobSpec",
    "PayloadError",
    "PermanentJobError",
    "ProgressError",
    "Registry",
    "Schedule",
    "ScheduleError",
    "SchemaMissing",
    "Snooze",
    "StoreConflict",
    "StoreError",
    "StorePermissionDenied",
    "StoreRefused",
    "StoreTimeout",
    "StoreUnavailable",
    "Task",
    "Worker",
    "Workflow",
    "current_job",
    "enqueue",
    "enqueue_batch",
    "enqueue_batch_sync",
    "enqueue_many",
    "enqueue_many_sync",
    "enqueue_payloads",
    "enqueue_payloads_sync",
    "enqueue_sync",
    "enqueue_workflow",
    "enqueue_workflow_sync",
    "run_worker",
]
