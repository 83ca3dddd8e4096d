"""`citus_faults`: a drain on a Citus cluster during which one worker process is killed (SIGKILL,
and a replacement started) and one worker node restarts; then, from the database and from the
handlers' own record (bench/citus_app.py), whether any job was lost, completed twice or run twice
at once. The servers and the scenarios' driver: bench/citus.py.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.citus import APP, FAULT_SETTINGS, Servers, _as_meter, _sql
from bench.citus_app import RECORD_DIR_ENV
from bench.core import Result, recording_dir
from bench.drain import drain_seconds
from bench.fleet import Fleet
from dispatcher import enqueue_payloads_sync
from dispatcher.devtools.harness import completed_jobs, progress

# -- faults ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One execution of the handler, from bench/citus_app.py's lines; `end` None: cut."""

    job_id: int
    pid: int
    start: float
    end: float | None


def read_runs(directory: Path) -> dict[int, list[Run]]:
    """job id -> its runs, from every worker process's record."""
    by_job: dict[int, list[Run]] = defaultdict(list)
    for path in directory.glob("*.log"):
        pid = int(path.stem)
        started: dict[tuple[str, str], None] = {}
        # Whole lines only: a killed process may have left a partial last one.
        for line in path.read_text().split("\n")[:-1]:
            job_id, _attempt, start, end = line.split()
            if end == "-":
                started[(job_id, start)] = None
                continue
            started.pop((job_id, start), None)
            by_job[int(job_id)].append(Run(int(job_id), pid, float(start), float(end)))
        for job_id, start in started:
            by_job[int(job_id)].append(Run(int(job_id), pid, float(start), None))
    return by_job


def check_runs(
    runs: dict[int, list[Run]], job_ids: set[int], killed_pid: int, killed_at: float
) -> dict[str, int]:
    """What the record says, as the Citus tier's fault tests check it (tests/citus): every job ran
    to its end at least once, no run was cut but by the kill, no two runs of one job overlapped (a
    killed run ends at the kill), and no job was run to its end twice by live workers (the killed
    worker's finished runs whose completions it never wrote run again, rightly)."""
    overlapping = 0
    for job_runs in runs.values():
        ordered = sorted(job_runs, key=lambda r: r.start)
        for i, a in enumerate(ordered):
            a_end = a.end if a.end is not None else (killed_at if a.pid == killed_pid else math.inf)
            overlapping += sum(1 for b in ordered[i + 1 :] if b.start < a_end)
    finished = {j for j, rs in runs.items() if any(r.end is not None for r in rs)}
    return {
        "never_ran": len(job_ids - finished),
        "cut_by_kill": sum(
            1 for rs in runs.values() for r in rs if r.end is None and r.pid == killed_pid
        ),
        "cut_by_live": sum(
            1 for rs in runs.values() for r in rs if r.end is None and r.pid != killed_pid
        ),
        "overlapping": overlapping,
        "completed_twice": sum(
            1
            for rs in runs.values()
            if sum(1 for r in rs if r.end is not None and r.pid != killed_pid) > 1
        ),
        "ran_again": sum(1 for rs in runs.values() if len(rs) > 1),
    }


class Watch:
    """The bench's session for a drain under faults: reconnects when a statement fails (a worker
    node restarting fails every statement that reaches it)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = _as_meter(dsn)
        self._conn: psycopg.Connection[Any] | None = None

    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
        return self._conn

    def completed(self) -> int | None:
        """Jobs completed, or None while the cluster does not answer."""
        try:
            return completed_jobs(self.conn())
        except psycopg.Error:
            if self._conn is not None:
                self._conn.close()
            return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _wait_for(
    watch: Watch, fleet: Fleet, done: int, jobs: int, label: str, started: float, deadline: float
) -> int:
    """Until `done` jobs are completed or the deadline; returns the last count."""
    count = 0
    while time.monotonic() < deadline:
        fleet.check_alive()
        count = watch.completed() or count
        progress(label, count, jobs, time.monotonic() - started)
        if count >= done:
            break
        time.sleep(0.1)
    return count


def faults_run(
    servers: Servers, mode: str, workers: int, jobs: int, *, timeout_s: float = 900
) -> dict[str, Any]:
    """A drain of N recorded no-op jobs on the cluster: at a quarter done, one worker process is
    killed (SIGKILL) and a replacement started; at half done, worker node 1 restarts (a fast
    shutdown, then a start on the same port). Then the checks, from the database and from the
    record."""
    target, cluster = servers.citus, servers.cluster
    label = f"citus_faults {mode} x{workers}"
    watch = Watch(target.dsn)
    try:
        with recording_dir(RECORD_DIR_ENV, "bench-citus-") as directory:
            watch.conn().execute("TRUNCATE dispatcher_jobs")
            with Fleet(target.dsn, mode, workers, app=APP, **FAULT_SETTINGS) as fleet:
                fleet.wait_ready()
                enqueue_payloads_sync(watch.conn(), "record", ({} for _ in range(jobs)))
                started = time.monotonic()
                deadline = started + timeout_s
                killed_done = _wait_for(watch, fleet, jobs // 4, jobs, label, started, deadline)
                killed_pid, killed_at = fleet.kill(0)
                fleet.spawn()
                restart_done = _wait_for(watch, fleet, jobs // 2, jobs, label, started, deadline)
                down = time.monotonic()
                cluster.workers[0].restart("fast")
                cluster.wait_ready(target.dsn)
                node_down_s = time.monotonic() - down
                _wait_for(watch, fleet, jobs, jobs, label, started, deadline)
                exits = fleet.stop()
            runs = read_runs(directory)
        conn = watch.conn()
        counts = dict(conn.execute(_sql("citus_status_counts")).fetchall())
        job_ids = {int(r[0]) for r in conn.execute("SELECT id FROM dispatcher_jobs")}
        row = conn.execute(_sql("citus_claimed_again")).fetchone()
        claimed_again = int(row[0]) if row else 0
        seconds = drain_seconds(conn)
    finally:
        watch.close()
    checks = check_runs(runs, job_ids, killed_pid, killed_at)
    completed = int(counts.get("completed", 0))
    failed_exits = [code for code in exits if code != 0]
    # A fault after the last job proves nothing: too few jobs for this machine's speed.
    mid_drain = max(killed_done, restart_done) < jobs
    ok = (
        mid_drain
        and completed == jobs
        and len(job_ids) == jobs
        and not failed_exits
        and not any(checks[k] for k in ("never_ran", "cut_by_live", "overlapping"))
        and checks["completed_twice"] == 0
    )
    return {
        "mode": mode,
        "workers": workers,
        "jobs": jobs,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds),
        # Jobs completed when each fault struck.
        "killed_at_done": killed_done,
        "restarted_at_done": restart_done,
        "faults_mid_drain": mid_drain,
        "node_down_s": round(node_down_s, 2),
        "claimed_again": claimed_again,
        "not_completed": jobs - completed,
        **checks,
        "live_worker_exits": exits,
        "statuses": counts,
        "outcome": "ok" if ok else "FAILED",
        **FAULT_SETTINGS,
    }


def faults_suite(
    servers: Servers, result: Result, *, jobs: int, workers: int, modes: list[str]
) -> None:
    for mode in modes:
        result.add(**faults_run(servers, mode, workers, jobs))
