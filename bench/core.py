"""Benchmark building blocks: a database to run on, the machine record, result files.

Every figure a scenario reports comes from one run on one server; ratios are computed between
rows of the same run, never across runs (absolute numbers move from run to run).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from dispatcher.db import migrate
from dispatcher.devtools.harness import measure_query

OUT_DIR = Path(__file__).resolve().parent / "out"


@contextmanager
def database(dsn: str | None, *, statements: bool = False) -> Iterator[str]:
    """The DSN given, or a throwaway embedded PostgreSQL with stock durability (fsync on), so the
    figures are those of a real deployment's settings, not of a RAM-disk toy. `statements`:
    the throwaway server preloads pg_stat_statements (bench/statements.py)."""
    if dsn:
        migrate(dsn)
        yield dsn
        return
    from dispatcher.devtools.embedded import start_postgres

    settings = {"shared_preload_libraries": "pg_stat_statements"} if statements else {}
    with start_postgres(durable=True, max_connections=300, settings=settings) as server:
        migrate(server.dsn)
        yield server.dsn


def machine(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size')"
            ).fetchall()
        )
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgres": server,
        "postgres_settings": settings,
        "note": "PostgreSQL, the workers and the benchmark driver share these cores",
    }


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE dispatcher_jobs, dispatcher_jobs_archive")
    conn.execute("SELECT pg_stat_reset()")


@dataclass
class Result:
    scenario: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def add(self, **row: Any) -> None:
        self.rows.append(row)
        print("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)

    def save(self, out_dir: Path = OUT_DIR) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.scenario}.json"
        path.write_text(json.dumps(asdict(self), indent=2, default=str))
        return path

    def table(self, columns: list[str]) -> str:
        widths = {c: max(len(c), *(len(_fmt(r.get(c, ""))) for r in self.rows)) for c in columns}
        lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
        lines += [
            "  ".join(_fmt(r.get(c, "")).rjust(widths[c]) for c in columns) for r in self.rows
        ]
        return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def run_processes(target: Callable[..., Any], args_list: list[tuple[Any, ...]]) -> list[Any]:
    """Run `target(*args)` in one process each (spawned: no inherited connections); results back."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(len(args_list)) as pool:
        return pool.starmap(target, args_list)


def cpu_seconds_of(pids: list[int]) -> float:
    """User+system CPU seconds so far of the given processes (from /proc; 0 where unreadable)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def postmaster_pid(dsn: str) -> int | None:
    """The server's postmaster pid when it runs on this machine (None otherwise)."""
    with psycopg.connect(dsn) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        try:
            return _stat(backend)[1]
        except (OSError, ValueError, IndexError):
            return None


def postgres_cpu_seconds(postmaster: int | None) -> float:
    """CPU seconds of the whole server so far: the postmaster, its live children, and (through
    the postmaster's cutime/cstime) every backend that has already exited, such as a worker's
    connection. A difference of two readings is the server's CPU over that interval."""
    if postmaster is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    fields = _stat(postmaster)
    total = sum(fields[i] for i in (11, 12, 13, 14))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                child = _stat(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
            if child[1] == postmaster:
                total += child[11] + child[12]
    return total / tick


def wait_backends_gone(
    postmaster: int | None, conn: psycopg.Connection[Any], timeout_s: float = 10.0
) -> None:
    """Until the server has reaped the client backends of conn's database but conn's own: an
    exited backend's CPU reaches postgres_cpu_seconds() only once the postmaster has waited for it
    (cutime), so a reading taken while the backends of processes that just closed their
    connections are still exiting misses theirs (a 1-worker ceiling once read 0 µs per job)."""
    if postmaster is None:
        return
    own, database = conn.info.backend_pid, conn.info.dbname
    deadline = time.monotonic() + timeout_s
    while [pid for pid in _client_backends(postmaster, database) if pid != own]:
        if time.monotonic() > deadline:
            print(
                f"  (client backends of {database} still up {timeout_s:g} s after the run: "
                "their CPU so far is counted, the rest is not)",
                flush=True,
            )
            return
        time.sleep(0.01)


def _client_backends(postmaster: int, database: str) -> list[int]:
    """The postmaster's children that serve a client of `database`: their title is
    'postgres: USER DATABASE HOST(PORT) ...' (or [local]); background processes have no host."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _stat(int(entry.name))[1] != postmaster:
                    continue
                words = (
                    (entry / "cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")
                    .split()
                )
            except (OSError, ValueError, IndexError):
                continue
            if database in words and any("(" in w or w == "[local]" for w in words):
                pids.append(int(entry.name))
    return pids


def _stat(pid: int) -> list[int]:
    """Numeric fields of /proc/PID/stat after the command name (index 0 is the state, as 0)."""
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return [0] + [int(x) for x in parts[1:]]


async def clocked_pair(
    dsn: str,
    claimer: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
    completer: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
) -> tuple[Any, Any]:
    """Run a plain-SQL drainer's claimer and completer, each on an autocommit connection of its
    own; (the database clock before the claimer starts, after the completer ends)."""
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c1,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c2,
    ):
        clock = measure_query("measure_clock")
        first = (await (await c1.execute(clock)).fetchone())[0]  # type: ignore[index]
        await asyncio.gather(claimer(c1), completer(c2))
        last = (await (await c2.execute(clock)).fetchone())[0]  # type: ignore[index]
    return first, last


@contextmanager
def recording_dir(env_var: str, prefix: str) -> Iterator[Path]:
    """A fresh directory for the workers' own recordings, named to them in `env_var` (worker
    processes inherit our environment), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as directory:
        os.environ[env_var] = directory
        try:
            yield Path(directory)
        finally:
            del os.environ[env_var]
