"""Run worker processes and read the database's own counters: shared by the demo, the benchmark
suite and the multi-process tests. Workers are real `dispatcher run` processes, as in production."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg


def progress(label: str, done: int, total: int, elapsed_s: float, stream: IO[str] | None = None) -> None:
    """A one-line progress bar redrawn in place on a terminal (one final line otherwise)."""
    stream = stream or sys.stderr
    width = 28
    filled = int(width * done / total) if total else width
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    line = f"  {label:<28} [{'#' * filled}{'.' * (width - filled)}] {done:>7}/{total} {rate:>8.0f} jobs/s"
    if stream.isatty():
        print("\r" + line, end="" if done < total else "\n", file=stream, flush=True)
    elif done >= total:
        print(line, file=stream, flush=True)


def worker_env(dsn: str, base: Mapping[str, str] | None = None, **settings: Any) -> dict[str, str]:
    """The environment of a worker process: ours minus any DISPATCHER_* setting, plus `settings`."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("DISPATCHER_")}
    env["DISPATCHER_DSN"] = dsn
    for key, value in settings.items():
        if value is None:
            continue
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        env[f"DISPATCHER_{key.upper()}"] = text
    return env


def start_worker(dsn: str, app: str, *, log: Path | None = None, cwd: Path | None = None,
                 extra_env: Mapping[str, str] | None = None, **settings: Any) -> subprocess.Popen[bytes]:
    env = worker_env(dsn, **settings)
    env.update(extra_env or {})
    out: IO[bytes] | int = open(log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen([sys.executable, "-m", "dispatcher", "run", "--app", app],
                                env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if not isinstance(out, int):
            out.close()


def stop_workers(procs: list[subprocess.Popen[bytes]], timeout_s: float = 30) -> list[int]:
    """SIGTERM all, wait for each (graceful shutdown), SIGKILL what outlives the timeout."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    codes = []
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


@dataclass(frozen=True, slots=True)
class TableCounters:
    """Cumulative counters of the jobs table: deltas per claimed job show contention directly."""

    claim_idx_tup_read: int  # index entries read through the two claim indexes
    idx_tup_fetch: int  # heap tuples fetched by index scans
    n_dead_tup: int
    completed: int

    def minus(self, before: TableCounters) -> TableCounters:
        return TableCounters(self.claim_idx_tup_read - before.claim_idx_tup_read,
                             self.idx_tup_fetch - before.idx_tup_fetch, self.n_dead_tup, self.completed - before.completed)


def table_counters(conn: psycopg.Connection[Any]) -> TableCounters:
    """Read after the workers exited: a backend flushes its statistics at exit (and otherwise at
    most once a second), so a mid-run reading may lag by up to a second of work."""
    row = conn.execute(
        """SELECT coalesce(sum(i.idx_tup_read) FILTER (WHERE i.indexrelname LIKE 'dispatcher_jobs_claim%%'), 0),
                  t.idx_tup_fetch, t.n_dead_tup,
                  (SELECT count(*) FROM dispatcher_jobs WHERE status = 'completed')
             FROM pg_stat_user_tables t JOIN pg_stat_user_indexes i ON i.relid = t.relid
            WHERE t.relname = 'dispatcher_jobs'
            GROUP BY t.idx_tup_fetch, t.n_dead_tup"""
    ).fetchone()
    assert row is not None
    return TableCounters(int(row[0]), int(row[1] or 0), int(row[2]), int(row[3]))


def lock_waiters(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'").fetchone()
    return int(row[0]) if row else 0
