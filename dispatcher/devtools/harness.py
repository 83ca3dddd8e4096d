"""Run worker processes and read the database's own counters: shared by the demo, the benchmark
suite and the multi-process tests. Workers are real `dispatcher run` processes, as in production.

`Fleet` is W of them in one mode, with the readiness wait every measured run starts from (the
demo's burst, bench/runs.py): each worker's /readyz answers 200 and, in partitioned mode, all 64
buckets are owned, so no measurement starts mid-rebalance.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg

from coordinator.pg.sqlfile import load
from dispatcher.constants import MODE_PARTITIONED, NUM_BUCKETS
from dispatcher.db import rows


def progress(
    label: str, done: int, total: int, elapsed_s: float, stream: IO[str] | None = None
) -> None:
    """A one-line progress bar redrawn in place on a terminal (one final line otherwise)."""
    stream = stream or sys.stderr
    width = 28
    filled = int(width * done / total) if total else width
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    line = (
        f"  {label:<28} [{'#' * filled}{'.' * (width - filled)}] {done:>7}/{total} {rate:>8.0f} "
        "jobs/s"
    )
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


_precompiled = False


def precompile() -> None:
    """Write the bytecode of dispatcher/ and coordinator/ once, as an installed package has it
    (pip compiles at install; the example Dockerfile runs compileall). Without it, a source
    checkout run with PYTHONDONTWRITEBYTECODE=1 (as on the machines these benchmarks ran on)
    compiles every module at every worker start: 0.1-0.2 s of CPU per process, more in partitioned
    mode (it also imports coordinator/), and 8 workers spawned together on 2 cores pay it inside the
    cold start they measure. A location that cannot be written is left as it is."""
    global _precompiled
    if _precompiled:
        return
    import compileall

    import coordinator

    for package in (
        Path(__file__).resolve().parents[1],
        Path(coordinator.__file__).resolve().parent,
    ):
        compileall.compile_dir(package, quiet=2)
    _precompiled = True


def start_worker(
    dsn: str,
    app: str,
    *,
    log: Path | None = None,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    **settings: Any,
) -> subprocess.Popen[bytes]:
    precompile()
    env = worker_env(dsn, **settings)
    env.update(extra_env or {})
    command = [sys.executable, "-m", "dispatcher", "run", "--app", app]
    if log is None:
        return subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
    # The child keeps its own copy of the descriptor: ours is closed once it has started.
    with open(log, "ab") as out:
        return subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


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


def free_port() -> int:
    """A TCP port the kernel just handed out and took back: free now, though not reserved (a worker
    that loses the race for it exits 1 naming DISPATCHER_METRICS_PORT)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def http_text(port: int, path: str, timeout_s: float = 2.0) -> str | None:
    """The body of GET http://127.0.0.1:port/path if it answers 200; None otherwise (refused, timed
    out, or another status such as /readyz's 503)."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=timeout_s
        ) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        exc.close()
        return None
    except OSError:
        return None


def gauge(text: str, name: str) -> float:
    """The value of gauge `name` in a /metrics page, summed over its labels (owned buckets are
    per queue)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Fleet:
    """`workers` worker processes of one mode running `app`; `serve`: each with its HTTP server on a
    free port (needed by wait_ready). Output goes to log_dir/worker-<i>.log, or nowhere."""

    def __init__(
        self,
        dsn: str,
        app: str,
        mode: str,
        workers: int,
        *,
        serve: bool = True,
        log_dir: Path | None = None,
        worker_id_prefix: str | None = None,
        **settings: Any,
    ) -> None:
        self.dsn, self.app, self.mode = dsn, app, mode
        self._serve, self._log_dir, self._prefix, self._settings = (
            serve,
            log_dir,
            worker_id_prefix,
            settings,
        )
        self.ports: list[int] = []
        self.logs: list[Path | None] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._spawned = 0
        if log_dir:
            log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for _ in range(workers):
                self.spawn()
        except BaseException:
            self.stop()
            raise

    @property
    def size(self) -> int:
        return len(self.procs)

    def spawn(self) -> int:
        """Start one more worker; returns its index (as a rollout's new pod)."""
        i, port = self._spawned, free_port() if self._serve else 0
        log = self._log_dir / f"worker-{i}.log" if self._log_dir else None
        self.procs.append(
            start_worker(
                self.dsn,
                self.app,
                log=log,
                mode=self.mode,
                metrics_port=port or None,
                worker_id=f"{self._prefix}-{i}" if self._prefix else None,
                **self._settings,
            )
        )
        self.ports.append(port)
        self.logs.append(log)
        self._spawned += 1
        return len(self.procs) - 1

    def retire(self, index: int, timeout_s: float = 60) -> int:
        """SIGTERM worker `index` (as a rollout does to an old pod) and wait for it; returns its
        exit code."""
        proc = self.procs.pop(index)
        self.ports.pop(index)
        self.logs.pop(index)
        return stop_workers([proc], timeout_s)[0]

    def worker_ready(self, index: int) -> bool:
        """Worker `index` answers /readyz with 200."""
        return http_text(self.ports[index], "/readyz") is not None

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[int]:
        return stop_workers(self.procs)

    def check_alive(self) -> None:
        """Raises if a worker exited, with the end of its log when there is one."""
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                codes = [p.poll() for p in self.procs]
                raise RuntimeError(
                    f"a worker process exited (codes {codes})"
                    + (f"; its log ends:\n{tail}" if tail else "")
                )

    def is_ready(self) -> bool:
        if not all(self.ports):
            raise ValueError("readiness needs every worker's HTTP server (serve=True)")
        if not all(http_text(port, "/readyz") for port in self.ports):
            return False
        if self.mode != MODE_PARTITIONED:
            return True
        texts = [http_text(port, "/metrics") for port in self.ports]
        pages = [text for text in texts if text is not None]
        if len(pages) < len(texts):
            return False
        owned = [gauge(text, "dispatcher_coordinator_owned_buckets") for text in pages]
        # Each worker a share (while there are no more workers than buckets): not mid-rebalance.
        return sum(owned) == NUM_BUCKETS and (self.size > NUM_BUCKETS or min(owned) > 0)

    def wait_ready(self, timeout_s: float = 60) -> float:
        """Waits until every worker's /readyz answers 200 and, in partitioned mode, all buckets are
        owned, each worker a share; returns the seconds waited."""
        started = time.monotonic()
        while True:
            self.check_alive()
            if self.is_ready():
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"{self.size} {self.mode} workers not ready after {timeout_s:g} s"
                )
            time.sleep(0.1)


@dataclass(frozen=True, slots=True)
class TableCounters:
    """Cumulative counters of the jobs table: deltas per claimed job show contention directly."""

    claim_idx_tup_read: int  # index entries read through the two claim indexes
    idx_tup_fetch: int  # heap tuples fetched by index scans
    n_dead_tup: int
    completed: int
    # Autovacuum's VACUUMs and ANALYZEs of the table: one that lands in a measured window adds its
    # CPU (the vacuum of the dead rows a drain leaves, two per job) to the server's.
    autovacuums: int

    def minus(self, before: TableCounters) -> TableCounters:
        return TableCounters(
            self.claim_idx_tup_read - before.claim_idx_tup_read,
            self.idx_tup_fetch - before.idx_tup_fetch,
            self.n_dead_tup,
            self.completed - before.completed,
            self.autovacuums - before.autovacuums,
        )


def measure_query(name: str) -> str:
    """A statement of devtools/sql/measure.sql: what the demo and the harness read to measure a
    run."""
    return load("dispatcher.devtools", "measure.sql")[name]


def db_clock(conn: psycopg.Connection[Any]) -> Any:
    """The database's clock now (clock_timestamp(), a datetime): what runs are timed on."""
    return rows.value(conn.execute(measure_query("measure_clock")).fetchone())


def table_counters(conn: psycopg.Connection[Any]) -> TableCounters:
    """Read after the workers exited: a backend flushes its statistics at exit (and otherwise at
    most once a second), so a mid-run reading may lag by up to a second of work."""
    read = rows.typed_one(
        TableCounters, conn.execute(measure_query("measure_table_counters")).fetchone()
    )
    assert read is not None
    return TableCounters(
        int(read.claim_idx_tup_read),
        int(read.idx_tup_fetch or 0),
        int(read.n_dead_tup),
        int(read.completed),
        int(read.autovacuums),
    )


def lock_waiters(conn: psycopg.Connection[Any]) -> int:
    return int(rows.value(conn.execute(measure_query("measure_lock_waiters")).fetchone()) or 0)


def completed_jobs(conn: psycopg.Connection[Any]) -> int:
    """Rows with status completed: none at all under DISPATCHER_COMPLETED_JOBS=delete (use
    jobs_left)."""
    return int(rows.value(conn.execute(measure_query("measure_completed_jobs")).fetchone()) or 0)


def jobs_left(conn: psycopg.Connection[Any]) -> int:
    """Jobs queued, running or waiting behind an ordering key: a drain is done when none is left,
    whether completions keep their rows or delete them."""
    return int(rows.value(conn.execute(measure_query("measure_jobs_left")).fetchone()) or 0)


# Counting the jobs (those completed, as the watch once did, or those left) scans the table: 20-40
# ms of a core at 200k rows. Counted every 0.05 s through a cold start of 8 workers, it took 2.2-2.8
# s of PostgreSQL's time in a 6-7 s run
# (pg_stat_statements), an eighth of what 2 cores had, from the fleet being measured. So the count
# runs about twice per expected remaining time, at most COUNT_EVERY_MAX_S apart and every `every_s`
# near the end; the lock-waiter sample (pg_stat_activity, no table scan) stays at every `every_s`.
COUNT_EVERY_MAX_S = 0.5


def next_count_in_s(done: int, jobs: int, elapsed_s: float, every_s: float) -> float:
    """Seconds until the next count of the jobs done: half the expected remaining time at the
    rate so far, between every_s and COUNT_EVERY_MAX_S."""
    if done <= 0 or elapsed_s <= 0:
        return max(every_s, COUNT_EVERY_MAX_S / 2)  # nothing done yet: no rate to go by
    remaining_s = (jobs - done) / (done / elapsed_s)
    return min(COUNT_EVERY_MAX_S, max(every_s, remaining_s / 2))


def watch_until_done(
    conn: psycopg.Connection[Any],
    fleet: Fleet,
    jobs: int,
    label: str,
    *,
    timeout_s: float,
    every_s: float,
) -> int:
    """Waits until `jobs` are done, drawing progress on stderr; a worker that exits or the
    deadline fails the wait. Returns the most sessions seen waiting on a lock at once (sampled
    every `every_s`; the jobs are counted less often, see next_count_in_s). Done is `jobs` minus
    the jobs left (queued or running), not a count of completed rows: under
    DISPATCHER_COMPLETED_JOBS=delete a completion leaves no row to count."""
    started, done, max_waiters = time.monotonic(), 0, 0
    count_at = started
    try:
        while done < jobs:
            fleet.check_alive()
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"{label}: {jobs - done} of {jobs} jobs left after {timeout_s:g} s"
                )
            time.sleep(every_s)
            max_waiters = max(max_waiters, lock_waiters(conn))
            now = time.monotonic()
            if now >= count_at:
                done = max(0, jobs - jobs_left(conn))
                count_at = now + next_count_in_s(done, jobs, now - started, every_s)
                progress(label, done, jobs, now - started, sys.stderr)
    except BaseException:
        if sys.stderr.isatty() and done < jobs:
            print(file=sys.stderr)  # end the progress line before the error
        raise
    return max_waiters
