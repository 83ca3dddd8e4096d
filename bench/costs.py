"""What the workers cost while they drain: CPU of PostgreSQL and of the worker processes, and
where PostgreSQL's time went (pg_stat_statements), over the same window as the plain-SQL ceiling
(bench/drain.py). How the window is chosen: docs/design/bench-method.md.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import statements
from bench.core import cpu_seconds_of, postgres_cpu_seconds
from bench.fleet import Fleet


@dataclass(frozen=True)
class Costs:
    pg_cpu_s: float  # the server's CPU, the bench's own session excluded
    client_cpu_s: float  # the worker processes' CPU
    # cumulative usage at the window's end minus start
    statements: dict[str, statements.Usage] | None


class CostMeter:
    """Readings of one fleet and server: `idle(seconds)`, then `start()` ... `stop()`."""

    def __init__(self, conn: psycopg.Connection[Any], postmaster: int | None, fleet: Fleet) -> None:
        self._conn, self._postmaster, self._fleet = conn, postmaster, fleet
        self._bench_backend = conn.info.backend_pid
        self._started: tuple[float, float, float, dict[str, statements.Usage] | None] | None = None
        if statements.RECORDING["on"]:
            # superusers only: else the bench's own statements appear in the table, under their
            # own names
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                conn.execute("SET pg_stat_statements.track = 'none'")

    def _reading(self) -> tuple[float, float, float]:
        return (
            postgres_cpu_seconds(self._postmaster),
            cpu_seconds_of([self._bench_backend]),
            self._fleet.cpu_seconds(),
        )

    def idle(self, seconds: float, settle_s: float = 1.0) -> dict[str, float]:
        """The idle fleet's cost per second: its polls, heartbeats and samplers (ms of CPU per s),
        after `settle_s` (the first second after readiness still has start-up's look-aheads,
        steal probes and coordinator traffic: 2-3x the steady figure)."""
        time.sleep(settle_s)
        pg0, own0, client0 = self._reading()
        time.sleep(seconds)
        pg1, own1, client1 = self._reading()
        return {
            "idle_pg_cpu_ms_per_s": round(1000 * ((pg1 - pg0) - (own1 - own0)) / seconds, 1),
            "idle_client_cpu_ms_per_s": round(1000 * (client1 - client0) / seconds, 1),
        }

    def start(self) -> None:
        usage = statements.snapshot(self._conn) if statements.RECORDING["on"] else None
        self._started = (*self._reading(), usage)

    def stop(self) -> Costs:
        assert self._started is not None, "CostMeter.stop() before start()"
        pg1, own1, client1 = self._reading()
        pg0, own0, client0, usage = self._started
        after = statements.snapshot(self._conn) if usage is not None else None
        return Costs(
            pg_cpu_s=(pg1 - pg0) - (own1 - own0),
            client_cpu_s=client1 - client0,
            statements=statements.minus(after, usage)
            if after is not None and usage is not None
            else None,
        )
