"""The worker's settings, declared: one field per setting (`DISPATCHER_<NAME>`, `--<name>`).

Each field declares its default, parser, help, unit and section (`setting(...)`, meta.py); that is
what the CLI, the reference docs and the env var parsing read. The rules a value must follow are in
rules.py; `Config` (config.py) is these fields, checked and resolved into each service's section.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid

from dispatcher.constants import (
    COMPLETED_KEEP,
    DEFAULT_QUEUE,
    MODE_PARTITIONED,
    NUM_BUCKETS,
)
from dispatcher.settings.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_COMPLETED_RETENTION_S,
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_COORDINATOR_LEASE_S,
    DEFAULT_COORDINATOR_POLL_S,
    DEFAULT_FAILED_RETENTION_S,
    DEFAULT_FLUSH_INTERVAL_S,
    DEFAULT_FLUSH_MAX,
    DEFAULT_HISTORY_RETENTION_S,
    DEFAULT_JOB_TIMEOUT_S,
    DEFAULT_LEASE_S,
    DEFAULT_LOOP_STALL_S,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_SNOOZES,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_PROGRESS_FLUSH_S,
    DEFAULT_PRUNE_BATCH,
    DEFAULT_PRUNE_INTERVAL_S,
    DEFAULT_REAPER_INTERVAL_S,
    DEFAULT_RETRY_BASE_S,
    DEFAULT_RETRY_CAP_S,
    DEFAULT_SHUTDOWN_GRACE_S,
    DEFAULT_STATEMENT_TIMEOUT_S,
    DEFAULT_STEAL_BATCH,
    DEFAULT_STUCK_EXIT_AFTER_S,
    DEFAULT_STUCK_GRACE_S,
    DEFAULT_SYNC_THREADS,
    DEFAULT_TABLE_SAMPLE_INTERVAL_S,
    DEFAULT_UNSERVED_TYPE_DISCARD_S,
    LISTEN_OFF,
    LOG_LEVELS,
)
from dispatcher.settings.meta import (
    Setting,
    parse_bool,
    parse_buckets,
    parse_queues,
    setting,
    setting_of,
)

ENV_PREFIX = "DISPATCHER_"


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigFields:
    """Every setting of a worker, declared once: its type, default, parser, help and section."""

    dsn: str | None = setting(
        None,
        section="database",
        parse=str,
        help="PostgreSQL connection string (postgresql://user:pass@host/db); required except by "
        "`dispatcher demo`",
    )
    listen_dsn: str | None = setting(
        None,
        section="worker",
        parse=str,
        shown="dsn",
        help="connection string used only for LISTEN (wake-ups of idle workers and of the "
        "PostgreSQL coordinator): a direct one to PostgreSQL when dsn goes through PgBouncer in "
        f"transaction pooling, where LISTEN hears nothing; {LISTEN_OFF}: no LISTEN, wake-ups by "
        "polling only",
    )
    mode: str = setting(
        MODE_PARTITIONED,
        section="claims",
        parse=str,
        help="claim strategy: partitioned (each worker claims from the buckets it owns) or "
        "skip_locked (all workers claim from one queue with FOR UPDATE SKIP LOCKED)",
    )
    queues: tuple[str, ...] = setting(
        (DEFAULT_QUEUE,),
        section="claims",
        parse=parse_queues,
        help="comma-separated queues this worker serves",
    )
    app: str | None = setting(
        None,
        section="worker",
        parse=str,
        help="module:attribute of your dispatcher.Registry (the handlers); required by `dispatcher "
        "run`",
    )
    worker_id: str = setting(
        section="worker",
        parse=str,
        default_factory=_default_worker_id,
        shown="HOST-PID-RANDOM",
        help="this worker's name in job locks, logs and coordinator membership; must be unique",
    )
    concurrency: int = setting(
        DEFAULT_CONCURRENCY,
        section="claims",
        parse=int,
        unit="jobs",
        help="jobs running at once in this worker process (>= 1)",
    )
    batch_size: int = setting(
        DEFAULT_BATCH_SIZE,
        section="claims",
        parse=int,
        unit="jobs",
        help="most jobs one claim statement takes (1 to 10000)",
    )
    poll_interval_s: float = setting(
        DEFAULT_POLL_INTERVAL_S,
        section="claims",
        parse=float,
        unit="seconds",
        help="idle poll interval in seconds; LISTEN/NOTIFY usually wakes a worker sooner",
    )
    lease_s: float = setting(
        DEFAULT_LEASE_S,
        section="leases",
        parse=float,
        unit="seconds",
        help="lease of a running job in seconds (>= 1); a dead worker's jobs come back after this",
    )
    heartbeat_interval_s: float | None = setting(
        None,
        section="leases",
        parse=float,
        unit="seconds",
        shown="lease_s / 3",
        help="seconds between extensions of running jobs' leases; at most lease_s / 2",
    )
    connect_timeout_s: float = setting(
        DEFAULT_CONNECT_TIMEOUT_S,
        section="database",
        parse=float,
        unit="seconds",
        help="seconds a new database connection may take (TCP, TLS and login) before it counts as "
        "unreachable",
    )
    statement_timeout_s: float | None = setting(
        None,
        section="database",
        parse=float,
        unit="seconds",
        shown=f"min({DEFAULT_STATEMENT_TIMEOUT_S:g}, lease_s / 2)",
        help="seconds one of the worker's own statements may take before its connection counts as "
        "stalled and is replaced (maintenance statements get 6x); at most lease_s / 2",
    )
    wait_for_schema: bool = setting(
        False,
        section="worker",
        parse=parse_bool,
        help="at start, wait (logging every few seconds) for a missing or older schema to be "
        "migrated instead of exiting; for a migration Job that runs beside the workers",
    )
    job_timeout_s: float = setting(
        DEFAULT_JOB_TIMEOUT_S,
        section="execution",
        parse=float,
        unit="seconds",
        help=(
            "wall-clock limit of one job in seconds, 0: none; @handler(timeout_s=...) overrides it"
        ),
    )
    retry_base_s: float = setting(
        DEFAULT_RETRY_BASE_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="backoff bound of the first retry in seconds; it doubles with each attempt",
    )
    retry_cap_s: float = setting(
        DEFAULT_RETRY_CAP_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="largest backoff bound of a retry in seconds (>= retry_base_s)",
    )
    max_snoozes: int = setting(
        DEFAULT_MAX_SNOOZES,
        section="execution",
        parse=int,
        unit="snoozes",
        help="snoozes (`raise Snooze(s)`) one job may take without spending attempts; past them "
        "each is a failed attempt",
    )
    unserved_type_discard_s: float = setting(
        DEFAULT_UNSERVED_TYPE_DISCARD_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="a job whose type has no handler in the worker that claimed it is handed back, its "
        "attempt not spent; once no worker has served its type for this many seconds (and the job "
        "is that old), it is discarded",
    )
    flush_interval_s: float = setting(
        DEFAULT_FLUSH_INTERVAL_S,
        section="completion",
        parse=float,
        unit="seconds",
        help="completions are written at most this many seconds late (over 0, at most 5)",
    )
    flush_max: int = setting(
        DEFAULT_FLUSH_MAX,
        section="completion",
        parse=int,
        unit="completions",
        help="completions are also written as soon as this many are pending (1 to 50000)",
    )
    max_result_bytes: int = setting(
        DEFAULT_MAX_RESULT_BYTES,
        section="completion",
        parse=int,
        unit="bytes",
        help="a handler's return value is stored with its job (JobHandle.result) if its JSON is "
        "at most this many bytes (1 to 16777216); a longer one is not, and last_error says so",
    )
    completed_jobs: str = setting(
        COMPLETED_KEEP,
        section="completion",
        parse=str,
        help="a successful job's row: keep (marked completed, deleted after "
        "completed_retention_s), archive (moved by the completion to a time-partitioned archive, "
        "whose partitions are dropped after completed_retention_s; `jobs list/show` read it) or "
        "delete (deleted by the completion itself: `jobs list/show` and status see no completed "
        "job)",
    )
    shutdown_grace_s: float = setting(
        DEFAULT_SHUTDOWN_GRACE_S,
        section="worker",
        parse=float,
        unit="seconds",
        help="seconds running jobs get to finish after SIGTERM before they are cancelled",
    )
    reaper_interval_s: float = setting(
        DEFAULT_REAPER_INTERVAL_S,
        section="maintenance",
        parse=float,
        unit="seconds",
        help="seconds between sweeps that put jobs whose lease expired through the retry policy",
    )
    prune_interval_s: float = setting(
        DEFAULT_PRUNE_INTERVAL_S,
        section="retention",
        parse=float,
        unit="seconds",
        help="seconds between rounds of the pruner, which deletes rows past their retention (one "
        "pod at a time)",
    )
    completed_retention_s: float = setting(
        DEFAULT_COMPLETED_RETENTION_S,
        section="retention",
        parse=float,
        unit="seconds",
        help="seconds completed jobs are kept before they are deleted; 0: kept forever",
    )
    failed_retention_s: float = setting(
        DEFAULT_FAILED_RETENTION_S,
        section="retention",
        parse=float,
        unit="seconds",
        help="seconds failed, discarded and cancelled jobs are kept before they are deleted; 0: "
        "kept forever",
    )
    history_retention_s: float = setting(
        DEFAULT_HISTORY_RETENTION_S,
        section="retention",
        parse=float,
        unit="seconds",
        help="seconds rows of the attempt history (dispatcher_job_attempts) are kept; 0: kept "
        "forever",
    )
    prune_batch: int = setting(
        DEFAULT_PRUNE_BATCH,
        section="retention",
        parse=int,
        unit="rows",
        help="most rows one DELETE of the pruner takes (1 to 10000)",
    )
    max_payload_bytes: int = setting(
        DEFAULT_MAX_PAYLOAD_BYTES,
        section="enqueue",
        parse=int,
        unit="bytes",
        shown="1048576 = 1 MiB",
        help="largest JSON payload in bytes that `dispatcher enqueue` accepts (>= 2)",
    )
    sync_threads: int = setting(
        DEFAULT_SYNC_THREADS,
        section="execution",
        parse=int,
        unit="threads",
        help="threads that run sync (def) handlers; async handlers need none",
    )
    progress_flush_s: float = setting(
        DEFAULT_PROGRESS_FLUSH_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="handlers' progress and metadata reports (job.set_progress, job.update_meta) are "
        "written, the latest of each job, in one statement per worker at most once per this many "
        "seconds (0.05 to 60)",
    )
    stuck_grace_s: float = setting(
        DEFAULT_STUCK_GRACE_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="a handler still running this many seconds after its timeout fired is stuck: logged, "
        "counted, its slot kept (docs/operations/running-workers.md#stuck-handlers)",
    )
    stuck_exit_after_s: float = setting(
        DEFAULT_STUCK_EXIT_AFTER_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="the worker stops claiming and exits (code 3) once a handler was stuck this many "
        "seconds, or stuck ones hold over half its slots or sync threads; 0: only the latter",
    )
    history: bool = setting(
        False,
        section="completion",
        parse=parse_bool,
        help="true: one row per attempt in dispatcher_job_attempts",
    )
    coordinator: str = setting(
        "postgres",
        section="coordination",
        parse=str,
        help="bucket assignment in partitioned mode: postgres, redis or static",
    )
    redis_url: str | None = setting(
        None,
        section="coordination",
        parse=str,
        help="Redis URL (redis://host:6379/0); required when coordinator is redis",
    )
    redis_key_prefix: str = setting(
        "dispatcher",
        section="coordination",
        parse=str,
        help=(
            "Redis coordinator: the start of every key and channel name "
            "(`<prefix>:<queue>:members`, ...); deployments that share one Redis database need "
            "different ones, or same-named queues merge their groups. No whitespace or {}"
        ),
    )
    coordinator_lease_s: float = setting(
        DEFAULT_COORDINATOR_LEASE_S,
        section="coordination",
        parse=float,
        unit="seconds",
        help="membership lease in seconds (>= 3): a dead worker's buckets move within this",
    )
    coordinator_poll_s: float = setting(
        DEFAULT_COORDINATOR_POLL_S,
        section="coordination",
        parse=float,
        unit="seconds",
        help="seconds between membership re-reads, at most coordinator_lease_s / 3; NOTIFY/pub-sub "
        "is sooner",
    )
    session_locks: bool = setting(
        True,
        section="coordination",
        parse=parse_bool,
        help="PostgreSQL coordinator: advisory-lock liveness; false behind PgBouncer transaction "
        "pooling (leases only)",
    )
    prepared_statements: bool = setting(
        True,
        section="database",
        parse=parse_bool,
        help="let psycopg prepare statements it runs often; false behind PgBouncer in transaction "
        "pooling older than 1.21 (or with max_prepared_statements = 0), where they fail on the "
        "next server connection",
    )
    steal: bool = setting(
        True,
        section="claims",
        parse=parse_bool,
        help="partitioned mode: take jobs from other buckets while ours are idle",
    )
    steal_batch: int = setting(
        DEFAULT_STEAL_BATCH,
        section="claims",
        parse=int,
        unit="jobs",
        help="jobs in a steal's first batch (1 to 10000); it doubles, up to batch_size, while "
        "steals come back full",
    )
    buckets: tuple[int, ...] | None = setting(
        None,
        section="coordination",
        parse=parse_buckets,
        shown="from worker_index/worker_count",
        help=f"static coordinator: this worker's buckets, e.g. 0-15,32 (0 to {NUM_BUCKETS - 1})",
    )
    worker_index: int = setting(
        0,
        section="coordination",
        parse=int,
        help="static coordinator: this worker is i of worker_count and owns buckets i, i+N, ...",
    )
    worker_count: int = setting(
        1,
        section="coordination",
        parse=int,
        unit="workers",
        help="static coordinator: number N of workers sharing the buckets",
    )
    metrics_port: int = setting(
        0,
        section="observability",
        parse=int,
        help="TCP port of the /metrics, /livez and /readyz server (all interfaces); 0: no server",
    )
    loop_stall_s: float = setting(
        DEFAULT_LOOP_STALL_S,
        section="observability",
        parse=float,
        unit="seconds",
        help="/livez fails once the event loop was silent for this many seconds (>= 2)",
    )
    table_sample_interval_s: float = setting(
        DEFAULT_TABLE_SAMPLE_INTERVAL_S,
        section="maintenance",
        parse=float,
        unit="seconds",
        help="seconds between samples of the table-wide metrics, taken by one pod at a time (> 0)",
    )
    web_host: str = setting(
        "127.0.0.1",
        section="web",
        parse=str,
        help="`dispatcher web --host`: the address it "
        "listens on; one that is not loopback needs web_token (or --insecure)",
    )
    web_port: int = setting(
        8080, section="web", parse=int, help="`dispatcher web --port`: its TCP port (1 to 65535)"
    )
    web_token: str | None = setting(
        None,
        section="web",
        parse=str,
        secret=True,
        help=(
            "`dispatcher web`: the token to log in with, or to send as `Authorization: Bearer "
            "<token>`; at least 16 characters, from the environment only (none: no login)"
        ),
    )
    web_session_secret: str | None = setting(
        None,
        section="web",
        parse=str,
        secret=True,
        help=(
            "`dispatcher web`: the key its login cookies and form tokens are signed with, the same "
            "on every replica (a login then works on each, and survives a restart; a new one "
            "logs everyone out); required with web_token; at least 32 characters, from the "
            "environment only"
        ),
    )
    web_allow_actions: bool = setting(
        False,
        section="web",
        parse=parse_bool,
        help=(
            "`dispatcher web --allow-actions`: show and accept retry, cancel, purge, pause and "
            "resume (else read-only)"
        ),
    )
    log_level: str = setting(
        "INFO", section="logging", parse=str, help=f"log level: {', '.join(LOG_LEVELS)}"
    )
    log_format: str = setting(
        "text",
        section="logging",
        parse=str,
        help="log lines: text (human-readable) or json (one JSON object per line)",
    )


# Each field as the CLI, the docs and the loader present it (env var, flag, parser, help), in
# declaration order; and the fields whose None means something (computed, or off).
SETTINGS: tuple[Setting, ...] = tuple(
    setting_of(f, ENV_PREFIX) for f in dataclasses.fields(ConfigFields) if f.init
)
NULLABLE = frozenset(
    f.name for f in dataclasses.fields(ConfigFields) if f.init and f.default is None
)
