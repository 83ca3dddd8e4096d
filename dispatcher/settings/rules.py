"""The rules a Config's values must follow: each field's kind, its range, and the rules between
fields (the heartbeat within the lease, the Redis URL with the Redis coordinator, ...).

`check` runs when a Config is built (config.py), so a Config that exists is valid; a broken rule
raises ConfigError naming the field. `heartbeat_s` and `statement_timeout_s` work out the two
values whose defaults depend on lease_s, for the rules and for the services' sections alike.
"""

from __future__ import annotations

import importlib.util
import math

from coordinator.pg.dsn import dsn_problem, redis_url_problem
from dispatcher.constants import (
    COMPLETED_JOBS,
    MODES,
    NAME_PATTERN,
    NUM_BUCKETS,
    is_valid_name,
)
from dispatcher.errors import ConfigError
from dispatcher.settings.defaults import (
    COORDINATORS,
    DEFAULT_STATEMENT_TIMEOUT_S,
    LISTEN_OFF,
    LOG_FORMATS,
    LOG_LEVELS,
    MIN_SESSION_SECRET,
    MIN_WEB_TOKEN,
    REDIS_KEY_PREFIX_RE,
    REDIS_REQUIREMENT,
)
from dispatcher.settings.fields import NULLABLE, SETTINGS, ConfigFields
from dispatcher.settings.meta import KINDS


def heartbeat_s(c: ConfigFields) -> float:
    """Seconds between lease extensions: heartbeat_interval_s, else a third of the lease."""
    return c.heartbeat_interval_s if c.heartbeat_interval_s is not None else c.lease_s / 3


def statement_timeout_s(c: ConfigFields) -> float:
    """The worker's statement timeout: statement_timeout_s, else min(5, half the lease)."""
    if c.statement_timeout_s is not None:
        return c.statement_timeout_s
    return min(DEFAULT_STATEMENT_TIMEOUT_S, c.lease_s / 2)


def check(c: ConfigFields) -> None:
    """Every rule; raises ConfigError(field name, message) at the first one broken."""
    for s in SETTINGS:
        value = getattr(c, s.name)
        if value is None and s.name in NULLABLE:
            continue
        _check(
            isinstance(value, KINDS[s.parse]),
            s.name,
            f"must be {' or '.join(k.__name__ for k in KINDS[s.parse])}, got "
            f"{type(value).__name__}",
        )
        if s.parse is float:
            _check(math.isfinite(value), s.name, f"must be a finite number, got {value!r}")
    # libpq's parse (redacted)
    problem = dsn_problem(c.dsn) if c.dsn is not None else None
    _check(problem is None, "dsn", f"is not a valid PostgreSQL connection string: {problem}")
    module, colon, attribute = (c.app or "").partition(":")
    _check(
        c.app is None or bool(module.strip() and colon and attribute.strip()),
        "app",
        f"must be module:attribute (e.g. myapp.jobs:registry), got {c.app!r}",
    )
    # one of a few words
    for name, among in (("mode", MODES), ("completed_jobs", COMPLETED_JOBS)):
        _check(
            getattr(c, name) in among,
            name,
            f"must be one of {', '.join(among)}, got {getattr(c, name)!r}",
        )
    # enqueue's rule: no job could be there
    bad_queues = [q for q in c.queues if not is_valid_name(q)]
    _check(
        bool(c.queues) and not bad_queues,
        "queues",
        f"must name queues matching {NAME_PATTERN}, got {bad_queues or 'none'}",
    )
    _check(c.concurrency >= 1, "concurrency", "must be >= 1")
    _check(1 <= c.batch_size <= 10_000, "batch_size", "must be between 1 and 10000")
    _check(c.poll_interval_s > 0, "poll_interval_s", "must be > 0")
    _check(c.lease_s >= 1, "lease_s", "must be >= 1 second")
    beat_s, statement_s = heartbeat_s(c), statement_timeout_s(c)
    _check(
        0 < beat_s <= c.lease_s / 2,
        "heartbeat_interval_s",
        f"must be > 0 and at most half of lease_s ({c.lease_s / 2:g}) so one lost beat "
        "never expires a lease",
    )
    _check(c.connect_timeout_s >= 1, "connect_timeout_s", "must be >= 1 second")
    _check(
        0 < statement_s <= c.lease_s / 2,
        "statement_timeout_s",
        f"must be > 0 and at most half of lease_s ({c.lease_s / 2:g}): a stalled statement must be "
        "noticed while the leases it protects still run",
    )
    _check(c.job_timeout_s >= 0, "job_timeout_s", "must be >= 0 (0 disables)")
    _check(c.retry_base_s > 0, "retry_base_s", "must be > 0")
    _check(c.retry_cap_s >= c.retry_base_s, "retry_cap_s", "must be >= retry_base_s")
    _check(0 <= c.max_snoozes <= 1_000_000, "max_snoozes", "must be between 0 and 1000000")
    _check(
        c.unserved_type_discard_s >= 60,
        "unserved_type_discard_s",
        "must be at least 60 (seconds): a rollout must have time to start its workers",
    )
    _check(0 < c.flush_interval_s <= 5, "flush_interval_s", "must be in (0, 5]")
    _check(1 <= c.flush_max <= 50_000, "flush_max", "must be between 1 and 50000")
    _check(
        1 <= c.max_result_bytes <= 16 * 1024 * 1024,
        "max_result_bytes",
        "must be between 1 and 16777216",
    )
    _check(c.shutdown_grace_s >= 0, "shutdown_grace_s", "must be >= 0")
    _check(c.reaper_interval_s > 0, "reaper_interval_s", "must be > 0")
    _check(c.prune_interval_s > 0, "prune_interval_s", "must be > 0")
    for name in ("completed_retention_s", "failed_retention_s", "history_retention_s"):
        _check(getattr(c, name) >= 0, name, "must be >= 0 (0: kept forever)")
    _check(1 <= c.prune_batch <= 10_000, "prune_batch", "must be between 1 and 10000")
    _check(c.max_payload_bytes >= 2, "max_payload_bytes", "must be >= 2")
    _check(c.sync_threads >= 1, "sync_threads", "must be >= 1")
    _check(0.05 <= c.progress_flush_s <= 60, "progress_flush_s", "must be between 0.05 and 60")
    for name in ("stuck_grace_s", "stuck_exit_after_s"):
        _check(getattr(c, name) >= 0, name, "must be >= 0")
    _check(
        c.coordinator in COORDINATORS,
        "coordinator",
        f"must be one of {', '.join(COORDINATORS)}, got {c.coordinator!r}",
    )
    _check(
        c.coordinator != "redis" or bool(c.redis_url),
        "redis_url",
        "is required when coordinator is 'redis'",
    )
    # redis-py comes with the `redis` extra: a worker on another coordinator never imports it, so
    # its absence is an error only here, in one line, not as a traceback at the worker's start.
    has_redis = bool(c.redis_url or c.coordinator == "redis") and _installed("redis")
    _check(
        c.coordinator != "redis" or has_redis,
        "coordinator",
        f"is 'redis', which needs redis-py (the `redis` extra): pip install '{REDIS_REQUIREMENT}'",
    )
    # redis-py's parse (redacted); without redis-py the URL is unused (the coordinator is not redis)
    problem = redis_url_problem(c.redis_url) if c.redis_url and has_redis else None
    _check(problem is None, "redis_url", f"is not a valid Redis URL: {problem}")
    _check(
        REDIS_KEY_PREFIX_RE.fullmatch(c.redis_key_prefix) is not None,
        "redis_key_prefix",
        f"must be non-empty, without whitespace or braces {{}}, got {c.redis_key_prefix!r}",
    )
    _check(c.coordinator_lease_s >= 3, "coordinator_lease_s", "must be >= 3 seconds")
    _check(
        0 < c.coordinator_poll_s <= c.coordinator_lease_s / 3,
        "coordinator_poll_s",
        "must be > 0 and at most a third of coordinator_lease_s",
    )
    _check(1 <= c.steal_batch <= 10_000, "steal_batch", "must be between 1 and 10000")
    _check(c.worker_count >= 1, "worker_count", "must be >= 1")
    _check(
        0 <= c.worker_index < c.worker_count,
        "worker_index",
        "must be in [0, worker_count)",
    )
    _check(0 <= c.metrics_port <= 65535, "metrics_port", "must be a TCP port or 0")
    _check(1 <= c.web_port <= 65535, "web_port", "must be a TCP port (1 to 65535)")
    _check(bool(c.web_host.strip()), "web_host", "must not be empty")
    make_one = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    _check(
        c.web_token is None or len(c.web_token.strip()) >= MIN_WEB_TOKEN,
        "web_token",
        f"must be at least {MIN_WEB_TOKEN} characters ({make_one})",
    )
    _check(
        c.web_token is None or c.web_session_secret is not None,
        "web_session_secret",
        "is required when DISPATCHER_WEB_TOKEN is set: the login cookies are signed with it, so "
        "every replica (and a restarted one) accepts them; give every replica the same one, "
        f"of at least {MIN_SESSION_SECRET} characters ({make_one})",
    )
    _check(
        c.web_session_secret is None or len(c.web_session_secret.strip()) >= MIN_SESSION_SECRET,
        "web_session_secret",
        f"must be at least {MIN_SESSION_SECRET} characters ({make_one})",
    )
    _check(
        c.web_session_secret is None or c.web_session_secret.strip() != (c.web_token or "").strip(),
        "web_session_secret",
        "must not be the token: one who saw the token must not learn the signing key",
    )
    _check(
        c.loop_stall_s >= 2,
        "loop_stall_s",
        "must be >= 2 seconds (the loop ticks every second)",
    )
    _check(c.table_sample_interval_s > 0, "table_sample_interval_s", "must be > 0")
    _check(
        c.listen_dsn is None or bool(c.listen_dsn.strip()),
        "listen_dsn",
        f"must be a connection string or {LISTEN_OFF!r}",
    )
    _check(
        c.log_level.upper() in LOG_LEVELS,
        "log_level",
        "must be DEBUG, INFO, WARNING or ERROR",
    )
    _check(
        c.log_format.lower() in LOG_FORMATS,
        "log_format",
        f"must be text or json, got {c.log_format!r}",
    )
    if c.buckets is not None:
        bad = [b for b in c.buckets if not (isinstance(b, int) and 0 <= b < NUM_BUCKETS)]
        _check(not bad, "buckets", f"buckets must be in 0..{NUM_BUCKETS - 1}, got {bad}")
        _check(
            bool(c.buckets),
            "buckets",
            "names no bucket: a worker with none would claim nothing",
        )
        # Only the static coordinator reads it: anywhere else it would be silently ignored.
        _check(
            c.coordinator == "static",
            "buckets",
            f"applies only to the static coordinator (coordinator is {c.coordinator!r})",
        )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(field, message)
