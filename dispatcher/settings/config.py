"""The worker's configuration: the settings (fields.py), checked (rules.py) and resolved into the
section each service receives (sections.py), from `DISPATCHER_*` env vars and CLI flags.

`Config.load` is the one loader; a Config is validated when built, so a bad value raises
`ConfigError` naming the field, env var or flag (the CLI exits 2). `settings()` lists every
setting for the CLI and docs/reference/configuration.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from coordinator.pg.connect import ConnectionLimits
from dispatcher.constants import COMPLETED_ARCHIVE, MODE_PARTITIONED, NUM_BUCKETS
from dispatcher.errors import ConfigError
from dispatcher.settings import rules
from dispatcher.settings import sections as sec
from dispatcher.settings.defaults import LISTEN_OFF
from dispatcher.settings.fields import ENV_PREFIX, SETTINGS, ConfigFields
from dispatcher.settings.meta import Setting, parse_buckets, parse_text

# Importable from here as they always were.
__all__ = ["ENV_PREFIX", "Config", "parse_buckets", "settings"]


@dataclasses.dataclass(frozen=True, slots=True)
class Config(ConfigFields):
    """A worker's settings (fields.py), valid (rules.py), with each service's section."""

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
        rules.check(self)
        self._resolve()

    def _resolve(self) -> None:
        """Each service's section, derived values worked out (sections.py); once, at
        construction."""
        beat_s, statement_s = rules.heartbeat_s(self), rules.statement_timeout_s(self)
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
                unserved_type_discard_s=self.unserved_type_discard_s,
                stuck_grace_s=self.stuck_grace_s,
                stuck_exit_after_s=self.stuck_exit_after_s,
                progress_flush_s=self.progress_flush_s,
            ),
            "completion": sec.CompletionSettings(
                self.flush_interval_s,
                self.flush_max,
                self.history,
                self.completed_jobs,
                self.max_result_bytes,
            ),
            "maintenance": sec.MaintenanceSettings(
                self.reaper_interval_s, self.history, self.table_sample_interval_s
            ),
            "retention": sec.RetentionSettings(
                self.prune_interval_s,
                MappingProxyType(retentions),
                self.prune_batch,
                archive=self.completed_jobs == COMPLETED_ARCHIVE,
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
                self.web_host.strip(),
                self.web_port,
                self.web_token,
                self.web_allow_actions,
                self.web_session_secret,
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
        for s in SETTINGS:
            raw = environ.get(s.env_var)
            # a flag wins, even over bad text
            if raw is not None and raw.strip() != "" and flags.get(s.name) is None:
                values[s.name] = parse_text(s, raw.strip(), s.env_var)
        for name, value in flags.items():
            if value is None:
                continue
            flag = _BY_NAME.get(name)
            if flag is None:
                raise ConfigError(f"--{name.replace('_', '-')}", "unknown setting")
            values[name] = parse_text(flag, value, flag.flag) if isinstance(value, str) else value
        try:
            return cls(**values)
        except ConfigError as exc:
            s = _BY_NAME[exc.setting]
            origin = s.flag if flags.get(s.name) is not None else s.env_var
            raise ConfigError(origin, exc.message) from None


_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def settings(*sections: str) -> tuple[Setting, ...]:
    """Every setting (Config field), in declaration order, with its env var, flag, parser, help,
    default and section; only those of `sections` when some are named."""
    return tuple(s for s in SETTINGS if s.section in sections) if sections else SETTINGS
