"""Worker configuration: one frozen dataclass built from `DISPATCHER_*` env vars and CLI flags.

Every field declares its parser, help and unit (`setting(...)`, meta.py); `settings()` lists them
for the CLI and docs/reference/configuration.md. A `Config` is validated when built: a bad value
raises `ConfigError` naming the field, env var or flag (the CLI exits 2).
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from coordinator.pg.connect import ConnectionLimits
from coordinator.pg.dsn import dsn_problem, redis_url_problem
from dispatcher.constants import (
    COMPLETED_JOBS,
    COMPLETED_KEEP,
    DEFAULT_QUEUE,
    MODE_PARTITIONED,
    MODES,
    NAME_PATTERN,
    NUM_BUCKETS,
    is_valid_name,
)
from dispatcher.errors import ConfigError
from dispatcher.settings import sections as sec
from dispatcher.settings.defaults import (
    COORDINATORS,
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
    DEFAULT_MAX_SNOOZES,
    DEFAULT_POLL_INTERVAL_S,
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
    LISTEN_OFF,
    LOG_FORMATS,
    LOG_LEVELS,
    REDIS_KEY_PREFIX_RE,
)
from dispatcher.settings.meta import (
    KINDS as _KINDS,
)
from dispatcher.settings.meta import (
    Setting,
    parse_buckets,
    parse_text,
    setting,
    setting_of,
)
from dispatcher.settings.meta import parse_bool as _parse_bool
from dispatcher.settings.meta import parse_queues as _parse_queues

ENV_PREFIX = "DISPATCHER_"


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
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
        "PostgreSQL "
        "coordinator): a direct one to PostgreSQL when dsn goes through PgBouncer in transaction "
        "pooling, "
        f"where LISTEN hears nothing; {LISTEN_OFF}: no LISTEN, wake-ups by polling only",
    )
    mode: str = setting(
        MODE_PARTITIONED,
        section="claims",
        parse=str,
        help="claim strategy: partitioned (each worker claims from the buckets it owns) or "
        "skip_locked "
        "(all workers claim from one queue with FOR UPDATE SKIP LOCKED)",
    )
    queues: tuple[str, ...] = setting(
        (DEFAULT_QUEUE,),
        section="claims",
        parse=_parse_queues,
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
        "stalled "
        "and is replaced (maintenance statements get 6x); at most lease_s / 2",
    )
    wait_for_schema: bool = setting(
        False,
        section="worker",
        parse=_parse_bool,
        help="at start, wait (logging every few seconds) for a missing or older schema to be "
        "migrated instead "
        "of exiting; for a migration Job that runs beside the workers",
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
    completed_jobs: str = setting(
        COMPLETED_KEEP,
        section="completion",
        parse=str,
        help="a successful job's row: keep (marked completed, deleted after completed_retention_s) "
        "or delete (deleted "
        "by the completion itself: no prune or vacuum later; `jobs list/show` and status see no "
        "completed job)",
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
    stuck_grace_s: float = setting(
        DEFAULT_STUCK_GRACE_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="a handler still running this many seconds after its timeout fired is stuck: logged, "
        "counted, its slot "
        "kept (docs/operations/running-workers.md#stuck-handlers)",
    )
    stuck_exit_after_s: float = setting(
        DEFAULT_STUCK_EXIT_AFTER_S,
        section="execution",
        parse=float,
        unit="seconds",
        help="the worker stops claiming and exits (code 3) once a handler was stuck this many "
        "seconds, or stuck "
        "ones hold over half its slots or sync threads; 0: only the latter",
    )
    history: bool = setting(
        False,
        section="completion",
        parse=_parse_bool,
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
            "(`<prefix>:<queue>:members`, ...); deployments that "
            "share one Redis database need different ones, or same-named queues merge their "
            "groups. No whitespace or {}"
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
        parse=_parse_bool,
        help="PostgreSQL coordinator: advisory-lock liveness; false behind PgBouncer transaction "
        "pooling (leases only)",
    )
    prepared_statements: bool = setting(
        True,
        section="database",
        parse=_parse_bool,
        help="let psycopg prepare statements it runs often; false behind PgBouncer in transaction "
        "pooling "
        "older than 1.21 (or with max_prepared_statements = 0), where they fail on the next server "
        "connection",
    )
    steal: bool = setting(
        True,
        section="claims",
        parse=_parse_bool,
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
            "<token>`; at least 16 "
            "characters, from the environment only (none: no login)"
        ),
    )
    web_allow_actions: bool = setting(
        False,
        section="web",
        parse=_parse_bool,
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

    # The sections each service receives (sections.py): resolved in __post_init__, not settings.
    database: sec.DatabaseSettings = dataclasses.field(init=False, repr=False, compare=False)
    logging: sec.LoggingSettings = dataclasses.field(init=False, repr=False, compare=False)
    worker: sec.WorkerSettings = dataclasses.field(init=False, repr=False, compare=False)
    claims: sec.ClaimSettings = dataclasses.field(init=False, repr=False, compare=False)
    leases: sec.LeaseSettings = dataclasses.field(init=False, repr=False, compare=False)
    execution: sec.ExecutionSettings = dataclasses.field(init=False, repr=False, compare=False)
    completion: sec.CompletionSettings = dataclasses.field(init=False, repr=False, compare=False)
    maintenance: sec.MaintenanceSettings = dataclasses.field(init=False, repr=False, compare=False)
    retention: sec.RetentionSettings = dataclasses.field(init=False, repr=False, compare=False)
    coordination: sec.CoordinationSettings = dataclasses.field(
        init=False, repr=False, compare=False
    )
    observability: sec.ObservabilitySettings = dataclasses.field(
        init=False, repr=False, compare=False
    )
    web: sec.WebSettings = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Every rule, at construction: a Config that exists is valid. Raises ConfigError(field
        name)."""
        for s in _SETTINGS:
            value = getattr(self, s.name)
            if value is None and s.name in _NULLABLE:
                continue
            _check(
                isinstance(value, _KINDS[s.parse]),
                s.name,
                f"must be {' or '.join(k.__name__ for k in _KINDS[s.parse])}, got "
                f"{type(value).__name__}",
            )
            if s.parse is float:
                _check(math.isfinite(value), s.name, f"must be a finite number, got {value!r}")
        # libpq's parse (redacted)
        problem = dsn_problem(self.dsn) if self.dsn is not None else None
        _check(problem is None, "dsn", f"is not a valid PostgreSQL connection string: {problem}")
        module, colon, attribute = (self.app or "").partition(":")
        _check(
            self.app is None or bool(module.strip() and colon and attribute.strip()),
            "app",
            f"must be module:attribute (e.g. myapp.jobs:registry), got {self.app!r}",
        )
        # one of a few words
        for name, among in (("mode", MODES), ("completed_jobs", COMPLETED_JOBS)):
            _check(
                getattr(self, name) in among,
                name,
                f"must be one of {', '.join(among)}, got {getattr(self, name)!r}",
            )
        # enqueue's rule: no job could be there
        bad_queues = [q for q in self.queues if not is_valid_name(q)]
        _check(
            bool(self.queues) and not bad_queues,
            "queues",
            f"must name queues matching {NAME_PATTERN}, got {bad_queues or 'none'}",
        )
        _check(self.concurrency >= 1, "concurrency", "must be >= 1")
        _check(1 <= self.batch_size <= 10_000, "batch_size", "must be between 1 and 10000")
        _check(self.poll_interval_s > 0, "poll_interval_s", "must be > 0")
        _check(self.lease_s >= 1, "lease_s", "must be >= 1 second")
        beat_s = (
            self.heartbeat_interval_s if self.heartbeat_interval_s is not None else self.lease_s / 3
        )
        statement_s = (
            self.statement_timeout_s
            if self.statement_timeout_s is not None
            else min(DEFAULT_STATEMENT_TIMEOUT_S, self.lease_s / 2)
        )
        _check(
            0 < beat_s <= self.lease_s / 2,
            "heartbeat_interval_s",
            f"must be > 0 and at most half of lease_s ({self.lease_s / 2:g}) so one lost beat "
            "never expires a lease",
        )
        _check(self.connect_timeout_s >= 1, "connect_timeout_s", "must be >= 1 second")
        _check(
            0 < statement_s <= self.lease_s / 2,
            "statement_timeout_s",
            f"must be > 0 and at most half of lease_s ({self.lease_s / 2:g}): a stalled statement "
            "must "
            "be noticed while the leases it protects still run",
        )
        _check(self.job_timeout_s >= 0, "job_timeout_s", "must be >= 0 (0 disables)")
        _check(self.retry_base_s > 0, "retry_base_s", "must be > 0")
        _check(self.retry_cap_s >= self.retry_base_s, "retry_cap_s", "must be >= retry_base_s")
        _check(0 <= self.max_snoozes <= 1_000_000, "max_snoozes", "must be between 0 and 1000000")
        _check(0 < self.flush_interval_s <= 5, "flush_interval_s", "must be in (0, 5]")
        _check(1 <= self.flush_max <= 50_000, "flush_max", "must be between 1 and 50000")
        _check(self.shutdown_grace_s >= 0, "shutdown_grace_s", "must be >= 0")
        _check(self.reaper_interval_s > 0, "reaper_interval_s", "must be > 0")
        _check(self.prune_interval_s > 0, "prune_interval_s", "must be > 0")
        for name in ("completed_retention_s", "failed_retention_s", "history_retention_s"):
            _check(getattr(self, name) >= 0, name, "must be >= 0 (0: kept forever)")
        _check(1 <= self.prune_batch <= 10_000, "prune_batch", "must be between 1 and 10000")
        _check(self.max_payload_bytes >= 2, "max_payload_bytes", "must be >= 2")
        _check(self.sync_threads >= 1, "sync_threads", "must be >= 1")
        for name in ("stuck_grace_s", "stuck_exit_after_s"):
            _check(getattr(self, name) >= 0, name, "must be >= 0")
        _check(
            self.coordinator in COORDINATORS,
            "coordinator",
            f"must be one of {', '.join(COORDINATORS)}, got {self.coordinator!r}",
        )
        _check(
            self.coordinator != "redis" or bool(self.redis_url),
            "redis_url",
            "is required when coordinator is 'redis'",
        )
        # redis-py's parse (redacted)
        problem = redis_url_problem(self.redis_url) if self.redis_url else None
        _check(problem is None, "redis_url", f"is not a valid Redis URL: {problem}")
        _check(
            REDIS_KEY_PREFIX_RE.fullmatch(self.redis_key_prefix) is not None,
            "redis_key_prefix",
            f"must be non-empty, without whitespace or braces {{}}, got {self.redis_key_prefix!r}",
        )
        _check(self.coordinator_lease_s >= 3, "coordinator_lease_s", "must be >= 3 seconds")
        _check(
            0 < self.coordinator_poll_s <= self.coordinator_lease_s / 3,
            "coordinator_poll_s",
            "must be > 0 and at most a third of coordinator_lease_s",
        )
        _check(1 <= self.steal_batch <= 10_000, "steal_batch", "must be between 1 and 10000")
        _check(self.worker_count >= 1, "worker_count", "must be >= 1")
        _check(
            0 <= self.worker_index < self.worker_count,
            "worker_index",
            "must be in [0, worker_count)",
        )
        _check(0 <= self.metrics_port <= 65535, "metrics_port", "must be a TCP port or 0")
        _check(1 <= self.web_port <= 65535, "web_port", "must be a TCP port (1 to 65535)")
        _check(bool(self.web_host.strip()), "web_host", "must not be empty")
        _check(
            self.web_token is None or len(self.web_token.strip()) >= 16,
            "web_token",
            "must be at least 16 characters (python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')",
        )
        _check(
            self.loop_stall_s >= 2,
            "loop_stall_s",
            "must be >= 2 seconds (the loop ticks every second)",
        )
        _check(self.table_sample_interval_s > 0, "table_sample_interval_s", "must be > 0")
        _check(
            self.listen_dsn is None or bool(self.listen_dsn.strip()),
            "listen_dsn",
            f"must be a connection string or {LISTEN_OFF!r}",
        )
        _check(
            self.log_level.upper() in LOG_LEVELS,
            "log_level",
            "must be DEBUG, INFO, WARNING or ERROR",
        )
        _check(
            self.log_format.lower() in LOG_FORMATS,
            "log_format",
            f"must be text or json, got {self.log_format!r}",
        )
        if self.buckets is not None:
            bad = [b for b in self.buckets if not (isinstance(b, int) and 0 <= b < NUM_BUCKETS)]
            _check(not bad, "buckets", f"buckets must be in 0..{NUM_BUCKETS - 1}, got {bad}")
            _check(
                bool(self.buckets),
                "buckets",
                "names no bucket: a worker with none would claim nothing",
            )
            # Only the static coordinator reads it: anywhere else it would be silently ignored.
            _check(
                self.coordinator == "static",
                "buckets",
                f"applies only to the static coordinator (coordinator is {self.coordinator!r})",
            )
        self._resolve(beat_s, statement_s)

    def _resolve(self, beat_s: float, statement_s: float) -> None:
        """Each service's section, derived values worked out (sections.py); once, at
        construction."""
        limits = ConnectionLimits(self.connect_timeout_s, statement_s, self.prepared_statements)
        listen: str | None = self.dsn if self.listen_dsn is None else self.listen_dsn
        if self.listen_dsn is not None and self.listen_dsn.strip().lower() == LISTEN_OFF:
            listen = None
        static = (
            self.buckets
            if self.buckets is not None
            else tuple(b for b in range(NUM_BUCKETS) if b % self.worker_count == self.worker_index)
        )
        retentions = {
            "completed": self.completed_retention_s,
            "failed": self.failed_retention_s,
            "history": self.history_retention_s,
        }
        # A coordination round must fail (and count towards degraded mode) well inside a membership
        # lease: a third of it, 3.3 s at the defaults.
        coordination_limits = dataclasses.replace(
            limits, statement_timeout_s=min(statement_s, self.coordinator_lease_s / 3)
        )
        resolved = {
            "database": sec.DatabaseSettings(self.dsn, limits),
            "logging": sec.LoggingSettings(self.log_level.upper(), self.log_format.lower()),
            "worker": sec.WorkerSettings(
                self.worker_id,
                self.app,
                listen,
                max(1.0, self.lease_s / 3),
                self.wait_for_schema,
                self.shutdown_grace_s,
            ),
            "claims": sec.ClaimSettings(
                self.mode,
                self.queues,
                self.concurrency,
                self.batch_size,
                self.poll_interval_s,
                self.lease_s,
                self.steal,
                self.steal_batch,
            ),
            "leases": sec.LeaseSettings(
                self.lease_s, beat_s, start_margin_s=beat_s / 2, lose_early_s=min(0.5, beat_s / 4)
            ),
            "execution": sec.ExecutionSettings(
                self.worker_id,
                self.job_timeout_s,
                self.sync_threads,
                self.retry_base_s,
                self.retry_cap_s,
                max_snoozes=self.max_snoozes,
                stuck_grace_s=self.stuck_grace_s,
                stuck_exit_after_s=self.stuck_exit_after_s,
            ),
            "completion": sec.CompletionSettings(
                self.flush_interval_s, self.flush_max, self.history, self.completed_jobs
            ),
            "maintenance": sec.MaintenanceSettings(
                self.reaper_interval_s, self.history, self.table_sample_interval_s
            ),
            "retention": sec.RetentionSettings(
                self.prune_interval_s, MappingProxyType(retentions), self.prune_batch
            ),
            "coordination": sec.CoordinationSettings(
                self.coordinator,
                self.mode == MODE_PARTITIONED,
                self.queues,
                self.worker_id,
                static,
                self.redis_url,
                self.redis_key_prefix,
                self.dsn,
                listen,
                coordination_limits,
                self.coordinator_lease_s,
                self.coordinator_poll_s,
                self.session_locks,
            ),
            "observability": sec.ObservabilitySettings(self.metrics_port, self.loop_stall_s),
            "web": sec.WebSettings(
                self.web_host.strip(), self.web_port, self.web_token, self.web_allow_actions
            ),
        }
        for name, section in resolved.items():
            object.__setattr__(self, name, section)

    def replace(self, **changes: Any) -> Config:
        """A copy with `changes`; validated like any construction (ConfigError names the field)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **flags: Any) -> Config:
        """Env vars first, then CLI flags (non-None values win); validated before it is returned.

        A bad value raises ConfigError naming the setting as the user wrote it: the flag if one
        was given for that field, else its env var.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for s in _SETTINGS:
            raw = environ.get(s.env_var)
            # a flag wins, even over bad text
            if raw is not None and raw.strip() != "" and flags.get(s.name) is None:
                values[s.name] = parse_text(s, raw.strip(), s.env_var)
        for name, value in flags.items():
            if value is None:
                continue
            s = _BY_NAME.get(name)
            if s is None:
                raise ConfigError(f"--{name.replace('_', '-')}", "unknown setting")
            values[name] = parse_text(s, value, s.flag) if isinstance(value, str) else value
        try:
            return cls(**values)
        except ConfigError as exc:
            s = _BY_NAME[exc.setting]
            origin = s.flag if flags.get(s.name) is not None else s.env_var
            raise ConfigError(origin, exc.message) from None


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(field, message)


_SETTINGS: tuple[Setting, ...] = tuple(
    setting_of(f, ENV_PREFIX) for f in dataclasses.fields(Config) if f.init
)
_BY_NAME: dict[str, Setting] = {s.name: s for s in _SETTINGS}
_NULLABLE = frozenset(f.name for f in dataclasses.fields(Config) if f.init and f.default is None)


def settings(*sections: str) -> tuple[Setting, ...]:
    """Every setting (Config field), in declaration order, with its env var, flag, parser, help,
    default and section; only those of `sections` when some are named."""
    return tuple(s for s in _SETTINGS if s.section in sections) if sections else _SETTINGS
