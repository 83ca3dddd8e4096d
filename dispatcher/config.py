"""Worker configuration: one frozen dataclass built from `DISPATCHER_*` env vars and CLI flags.

Every field has a named default with its unit in the name. `Config.load()` parses and validates
everything at start-up; a bad value raises `ConfigError` naming the env var (or flag) it came
from, and the CLI turns that into exit code 2.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .constants import DEFAULT_QUEUE, MODE_PARTITIONED, MODES, NUM_BUCKETS
from .errors import ConfigError

ENV_PREFIX = "DISPATCHER_"

# Defaults, with the reason for each number.
DEFAULT_CONCURRENCY = 100  # jobs running at once per worker process
DEFAULT_BATCH_SIZE = 500  # max jobs per claim statement: ~0.002 round trips per job (PERF-NOTES)
DEFAULT_POLL_INTERVAL_S = 1.0  # idle fallback poll; LISTEN/NOTIFY wakes us sooner
DEFAULT_LEASE_S = 30.0  # a crashed worker's jobs come back after at most this
DEFAULT_JOB_TIMEOUT_S = 600.0  # per-job wall-clock limit; 0 disables
DEFAULT_RETRY_BASE_S = 1.0  # first retry waits up to 1 s ...
DEFAULT_RETRY_CAP_S = 900.0  # ... doubling per attempt, capped at 15 min
DEFAULT_FLUSH_INTERVAL_S = 0.05  # completions are written at most 50 ms late (River's figure)
DEFAULT_FLUSH_MAX = 2000  # ... or as soon as 2,000 are pending
DEFAULT_SHUTDOWN_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds is 30
DEFAULT_REAPER_INTERVAL_S = 5.0
DEFAULT_PRUNE_INTERVAL_S = 60.0
DEFAULT_COMPLETED_RETENTION_S = 3600.0  # finished rows kept an hour for inspection, then deleted
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB: a job payload is a reference, not a blob store
DEFAULT_SYNC_THREADS = 8  # threads for sync handlers; async ones need none
DEFAULT_COORDINATOR_LEASE_S = 10.0  # a dead worker's buckets move within this (+ ~0.1 s)
DEFAULT_COORDINATOR_POLL_S = 1.0  # membership re-read at least this often; NOTIFY/pub-sub is faster
DEFAULT_STEAL_BATCH = 100  # jobs taken per poll from other buckets when our own are idle
COORDINATORS = ("postgres", "redis", "static")


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    dsn: str | None = None
    mode: str = MODE_PARTITIONED
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    worker_id: str = dataclasses.field(default_factory=_default_worker_id)
    concurrency: int = DEFAULT_CONCURRENCY
    batch_size: int = DEFAULT_BATCH_SIZE
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    lease_s: float = DEFAULT_LEASE_S
    heartbeat_interval_s: float | None = None  # None: lease_s / 3
    job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S
    retry_base_s: float = DEFAULT_RETRY_BASE_S
    retry_cap_s: float = DEFAULT_RETRY_CAP_S
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    flush_max: int = DEFAULT_FLUSH_MAX
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    reaper_interval_s: float = DEFAULT_REAPER_INTERVAL_S
    prune_interval_s: float = DEFAULT_PRUNE_INTERVAL_S
    completed_retention_s: float = DEFAULT_COMPLETED_RETENTION_S
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    sync_threads: int = DEFAULT_SYNC_THREADS
    history: bool = False
    coordinator: str = "postgres"
    redis_url: str | None = None
    coordinator_lease_s: float = DEFAULT_COORDINATOR_LEASE_S
    coordinator_poll_s: float = DEFAULT_COORDINATOR_POLL_S
    session_locks: bool = True  # false behind PgBouncer transaction pooling (leases only)
    steal: bool = True  # partitioned mode: take work from other buckets while ours are idle
    steal_batch: int = DEFAULT_STEAL_BATCH
    buckets: tuple[int, ...] | None = None  # static assignment; None: from worker_index/worker_count
    worker_index: int = 0
    worker_count: int = 1
    metrics_port: int = 0  # 0: no metrics HTTP server
    log_level: str = "INFO"

    @property
    def heartbeat_s(self) -> float:
        return self.heartbeat_interval_s if self.heartbeat_interval_s is not None else self.lease_s / 3

    @property
    def static_buckets(self) -> tuple[int, ...]:
        """The buckets a static assignment gives this worker: explicit list, or worker i of N."""
        if self.buckets is not None:
            return self.buckets
        return tuple(b for b in range(NUM_BUCKETS) if b % self.worker_count == self.worker_index)

    def replace(self, **changes: Any) -> Config:
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        _check(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        _check(bool(self.queues) and all(self.queues), "queues", "must name at least one non-empty queue")
        _check(self.concurrency >= 1, "concurrency", "must be >= 1")
        _check(1 <= self.batch_size <= 10_000, "batch_size", "must be between 1 and 10000")
        _check(self.poll_interval_s > 0, "poll_interval_s", "must be > 0")
        _check(self.lease_s >= 1, "lease_s", "must be >= 1 second")
        _check(
            0 < self.heartbeat_s <= self.lease_s / 2,
            "heartbeat_interval_s",
            f"must be > 0 and at most half of lease_s ({self.lease_s / 2:g}) so one lost beat never expires a lease",
        )
        _check(self.job_timeout_s >= 0, "job_timeout_s", "must be >= 0 (0 disables)")
        _check(self.retry_base_s > 0, "retry_base_s", "must be > 0")
        _check(self.retry_cap_s >= self.retry_base_s, "retry_cap_s", "must be >= retry_base_s")
        _check(0 < self.flush_interval_s <= 5, "flush_interval_s", "must be in (0, 5]")
        _check(1 <= self.flush_max <= 50_000, "flush_max", "must be between 1 and 50000")
        _check(self.shutdown_grace_s >= 0, "shutdown_grace_s", "must be >= 0")
        _check(self.reaper_interval_s > 0, "reaper_interval_s", "must be > 0")
        _check(self.prune_interval_s > 0, "prune_interval_s", "must be > 0")
        _check(self.completed_retention_s >= 0, "completed_retention_s", "must be >= 0")
        _check(self.max_payload_bytes >= 2, "max_payload_bytes", "must be >= 2")
        _check(self.sync_threads >= 1, "sync_threads", "must be >= 1")
        _check(self.coordinator in COORDINATORS, "coordinator",
               f"must be one of {', '.join(COORDINATORS)}, got {self.coordinator!r}")
        _check(self.coordinator != "redis" or bool(self.redis_url), "redis_url",
               "is required when coordinator is 'redis'")
        _check(self.coordinator_lease_s >= 3, "coordinator_lease_s", "must be >= 3 seconds")
        _check(0 < self.coordinator_poll_s <= self.coordinator_lease_s / 3, "coordinator_poll_s",
               "must be > 0 and at most a third of coordinator_lease_s")
        _check(1 <= self.steal_batch <= 10_000, "steal_batch", "must be between 1 and 10000")
        _check(self.worker_count >= 1, "worker_count", "must be >= 1")
        _check(0 <= self.worker_index < self.worker_count, "worker_index", "must be in [0, worker_count)")
        _check(0 <= self.metrics_port <= 65535, "metrics_port", "must be a TCP port or 0")
        _check(
            self.log_level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"),
            "log_level",
            "must be DEBUG, INFO, WARNING or ERROR",
        )
        if self.buckets is not None:
            bad = [b for b in self.buckets if not 0 <= b < NUM_BUCKETS]
            _check(not bad, "buckets", f"buckets must be in 0..{NUM_BUCKETS - 1}, got {bad}")

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **flags: Any) -> Config:
        """Env vars first, then CLI flags (non-None values win); validated before it is returned."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            var = ENV_PREFIX + field.name.upper()
            raw = environ.get(var)
            if raw is not None and raw.strip() != "":
                values[field.name] = _parse(field.name, raw.strip(), var)
        for name, value in flags.items():
            if value is None:
                continue
            if name not in _PARSERS:
                raise ConfigError(f"--{name.replace('_', '-')}", "unknown setting")
            flag = f"--{name.replace('_', '-')}"
            values[name] = _parse(name, value, flag) if isinstance(value, str) else value
        try:
            config = cls(**values)
            config.validate()
        except _Invalid as exc:
            origin = _origin_of(exc.field, environ, flags)
            raise ConfigError(origin, exc.message) from None
        return config


class _Invalid(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise _Invalid(field, message)


def _origin_of(field: str, environ: Mapping[str, str], flags: Mapping[str, Any]) -> str:
    if flags.get(field) is not None:
        return f"--{field.replace('_', '-')}"
    return ENV_PREFIX + field.upper()


def parse_buckets(text: str) -> tuple[int, ...]:
    """'0-15,32,40-41' -> (0, ..., 15, 32, 40, 41). Raises ValueError on bad syntax."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi < lo:
                raise ValueError(f"range {part!r} runs backwards")
            out.update(range(lo, hi + 1))
        else:
            out.add(int(part))
    return tuple(sorted(out))


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _parse_queues(text: str) -> tuple[str, ...]:
    return tuple(q.strip() for q in text.split(",") if q.strip())


_PARSERS: dict[str, Callable[[str], Any]] = {
    "dsn": str,
    "mode": str,
    "queues": _parse_queues,
    "worker_id": str,
    "concurrency": int,
    "batch_size": int,
    "poll_interval_s": float,
    "lease_s": float,
    "heartbeat_interval_s": float,
    "job_timeout_s": float,
    "retry_base_s": float,
    "retry_cap_s": float,
    "flush_interval_s": float,
    "flush_max": int,
    "shutdown_grace_s": float,
    "reaper_interval_s": float,
    "prune_interval_s": float,
    "completed_retention_s": float,
    "max_payload_bytes": int,
    "sync_threads": int,
    "history": _parse_bool,
    "coordinator": str,
    "redis_url": str,
    "coordinator_lease_s": float,
    "coordinator_poll_s": float,
    "session_locks": _parse_bool,
    "steal": _parse_bool,
    "steal_batch": int,
    "buckets": parse_buckets,
    "worker_index": int,
    "worker_count": int,
    "metrics_port": int,
    "log_level": str,
}


def _parse(name: str, raw: str, origin: str) -> Any:
    try:
        return _PARSERS[name](raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(origin, f"cannot parse {raw!r}: {exc}") from None
