"""The worker's settings by component: one small frozen dataclass per service, built by `Config`.

`Config` (config.py) is the one loader of env vars and flags, checked by rules.py; each service gets
only its own section (`config.claims`, `config.leases`, ...). Derived values (the heartbeat
interval, the statement timeout, the LISTEN target, the static buckets) are resolved into them
once, when the Config is built, so no service keeps a raw value beside a derived one or
recomputes it.
Every setting names its section in its metadata (`setting(..., section=...)`), which is how the
docs group the configuration reference and how each command picks the flags it shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator.pg.connect import ConnectionLimits
from dispatcher.constants import COMPLETED_DELETE, COMPLETED_KEEP, MODE_PARTITIONED
from dispatcher.settings.defaults import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_PROGRESS_FLUSH_S,
    DEFAULT_STUCK_EXIT_AFTER_S,
    DEFAULT_STUCK_GRACE_S,
)

# Section names, in the order the configuration reference lists them.
DATABASE = "database"
LOGGING = "logging"
ENQUEUE = "enqueue"
WORKER = "worker"
CLAIMS = "claims"
LEASES = "leases"
EXECUTION = "execution"
COMPLETION = "completion"
MAINTENANCE = "maintenance"
RETENTION = "retention"
COORDINATION = "coordination"
OBSERVABILITY = "observability"
WEB = "web"
SECTIONS = (
    DATABASE,
    LOGGING,
    ENQUEUE,
    WORKER,
    CLAIMS,
    LEASES,
    EXECUTION,
    COMPLETION,
    MAINTENANCE,
    RETENTION,
    COORDINATION,
    OBSERVABILITY,
    WEB,
)


@dataclass(frozen=True, slots=True)
class DatabaseSettings:
    """Where every command connects, and the bounds of each connection
    (coordinator/pg/connect.py)."""

    dsn: str | None
    # statement timeout resolved: statement_timeout_s, else min(5, lease_s / 2)
    limits: ConnectionLimits


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    level: str  # upper case
    format: str  # lower case: text or json


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """The worker process as a whole: its name, its app, start-up and shutdown."""

    worker_id: str
    app: str | None  # module:attribute of the Registry; `dispatcher run` requires it
    listen_dsn: str | None  # where LISTEN goes: listen_dsn, else dsn; None: nowhere (polling only)
    # how often an idle LISTEN connection is probed: a third of the lease, >= 1 s
    listen_probe_s: float
    wait_for_schema: bool
    shutdown_grace_s: float


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    """What the producer reads: how much to claim, from where, how often, and stealing."""

    mode: str
    queues: tuple[str, ...]
    concurrency: int
    batch_size: int
    poll_interval_s: float
    lease_s: float  # the lease a claim takes
    steal: bool
    steal_batch: int

    @property
    def partitioned(self) -> bool:
        return self.mode == MODE_PARTITIONED


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Leases of running jobs: how long, how often they are extended, and the executor's margins."""

    lease_s: float
    heartbeat_s: float  # heartbeat_interval_s, else lease_s / 3
    # A backlogged sync job starts only with this much lease left (half a heartbeat interval).
    start_margin_s: float
    # A job whose lease is about to run out unextended is stopped this long before (<= 0.5 s).
    lose_early_s: float


@dataclass(frozen=True, slots=True)
class ExecutionSettings:
    """How the executor runs handlers, and the retry policy's backoff."""

    worker_id: str
    job_timeout_s: float  # 0: none
    sync_threads: int
    retry_base_s: float
    retry_cap_s: float
    max_snoozes: int = 100  # snoozes per job that do not spend an attempt (DISPATCHER_MAX_SNOOZES)
    # a job of a type nobody served this long is discarded (DISPATCHER_UNSERVED_TYPE_DISCARD_S)
    unserved_type_discard_s: float = 3600.0
    # A handler still running this long after its timeout fired is stuck (runtime/stuck.py) ...
    stuck_grace_s: float = DEFAULT_STUCK_GRACE_S
    # ... and the worker exits once one is stuck this long (0: never for that), or stuck ones hold
    # over half the slots or sync threads.
    stuck_exit_after_s: float = DEFAULT_STUCK_EXIT_AFTER_S
    # handlers' progress reports are written at most this often (runtime/progress.py)
    progress_flush_s: float = DEFAULT_PROGRESS_FLUSH_S


@dataclass(frozen=True, slots=True)
class CompletionSettings:
    """How the completer batches its writes, and what a successful completion does to the row."""

    flush_interval_s: float
    flush_max: int
    history: bool  # one row per attempt in dispatcher_job_attempts
    # keep: marked completed; delete: the completion deletes the row
    completed_jobs: str = COMPLETED_KEEP
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES  # a handler's return value, as JSON

    @property
    def deletes(self) -> bool:
        return self.completed_jobs == COMPLETED_DELETE


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """The reaper and the planner statistics (every pod), and the table sampler (one pod)."""

    reaper_interval_s: float
    history: bool
    table_sample_interval_s: float


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    interval_s: float
    # kind (completed, failed, history) -> seconds; 0: kept forever
    retentions_s: Mapping[str, float]
    batch: int
    # DISPATCHER_COMPLETED_JOBS=archive: completed jobs live in the archive, kept by partition
    archive: bool = False


@dataclass(frozen=True, slots=True)
class CoordinationSettings:
    """Everything the bucket assignments of one worker are built from (serve/coordination.py)."""

    coordinator: str  # postgres, redis or static
    partitioned: bool
    queues: tuple[str, ...]
    member: str  # the worker id
    static_buckets: tuple[int, ...]  # the static coordinator: buckets, else worker i of N
    redis_url: str | None
    redis_key_prefix: str  # Redis keys of a queue's group: <redis_key_prefix>:<queue>:...
    dsn: str | None
    listen_dsn: str | None  # as WorkerSettings.listen_dsn
    # a round must fail well inside a membership lease: min(statement, lease / 3)
    limits: ConnectionLimits
    lease_s: float
    poll_s: float
    session_locks: bool

    @property
    def used(self) -> bool:
        """A coordinator runs (partitioned mode, not static): its state is a readiness check."""
        return self.partitioned and self.coordinator != "static"


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    metrics_port: int  # 0: no server
    loop_stall_s: float


@dataclass(frozen=True, slots=True)
class WebSettings:
    """`dispatcher web`, the dashboard (dispatcher/web/): where it listens, who may use it, what
    it may do."""

    host: str
    port: int
    token: str | None = field(repr=False)  # None: no login (loopback only, unless --insecure)
    allow_actions: bool
    # signs the login cookies and CSRF tokens (security.py); required with a token
    session_secret: str | None = field(repr=False)
