"""`churn`: a steady stream of jobs for minutes, at the defaults a user gets, with a short
retention: how the jobs table, its claims and PostgreSQL's cost per job age as work goes through
it, per DISPATCHER_COMPLETED_JOBS value and mode, then what one retention pass costs. What each
reading is and how it is taken: docs/guides/benchmarks.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.core import Result, postgres_cpu_seconds, postmaster_pid, reset
from bench.fleet import Fleet, quantile_ms
from coordinator.pg.sqlfile import load
from dispatcher import enqueue_payloads_sync
from dispatcher.devtools.harness import jobs_left

COLUMNS = [
    "kind",
    "completed_jobs",
    "mode",
    "workers",
    "at_s",
    "jobs_per_s",
    "backlog",
    "table_mb",
    "indexes_mb",
    "dead_tuples",
    "live_tuples",
    "autovacuums",
    "claim_p50_ms",
    "claim_p99_ms",
    "pg_cpu_us_per_job",
    "wal_bytes_per_job",
    "archive_mb",
]
PASS_COLUMNS = [
    "completed_jobs",
    "mode",
    "pass_rows",
    "pass_s",
    "pass_wal_mb",
    "dead_tuples_after_pass",
    "archive_dead_tuples_after_pass",
]
TICK_S = 0.1  # the producer commits a batch this often
PASS_BATCH = 1000  # rows per DELETE of the retention pass: the pruner's default batch
DRAIN_TIMEOUT_S = 120.0  # after the stream stops, for the backlog to be claimed and finished


def churn_query(name: str) -> str:
    """A statement of bench/sql/churn.sql."""
    return load("bench", "churn.sql")[name]


class Producer(threading.Thread):
    """Commits `rate` no-op jobs a second, a batch every TICK_S, on a connection of its own,
    catching up after a slow commit; `stop()` ends it, and re-raises what made it fail."""

    def __init__(self, dsn: str, rate: float) -> None:
        super().__init__(name="churn-producer", daemon=True)
        self.dsn, self.rate = dsn, rate
        self.enqueued = 0
        self.failure: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                started = time.monotonic()
                while not self._stopping.wait(TICK_S):
                    due = int(self.rate * (time.monotonic() - started)) - self.enqueued
                    if due > 0:
                        payloads = ({} for _ in range(due))
                        self.enqueued += enqueue_payloads_sync(conn, "noop", payloads)
        except BaseException as exc:  # handed to the main thread by check() and stop()
            self.failure = exc

    def check(self) -> None:
        if self.failure is not None:
            raise RuntimeError("the churn producer failed") from self.failure

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=30)
        self.check()


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic()
    finished: int  # jobs enqueued and no longer queued, running or waiting
    backlog: int
    pg_cpu_s: float
    sample: dict[str, float]
    claim: list[tuple[float, float]]  # the fleet's claim histogram, cumulative


def _reading(
    conn: psycopg.Connection[Any], fleet: Fleet, producer: Producer, postmaster: int | None
) -> Reading:
    enqueued = producer.enqueued  # before the count: a job enqueued after it is not finished
    left = jobs_left(conn)
    return Reading(
        time.monotonic(),
        enqueued - left,
        left,
        postgres_cpu_seconds(postmaster),
        _sample(conn),
        fleet.histograms().get("dispatcher_claim_seconds", []),
    )


def _minus(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[Any]:
    earlier = dict(before)
    return [(bound, n - earlier.get(bound, 0.0)) for bound, n in after]


def _interval(start: float, prev: Reading, now: Reading) -> dict[str, Any]:
    done = max(1, now.finished - prev.finished)
    claim = _minus(now.claim, prev.claim)
    p50, p99 = quantile_ms(claim, 0.5), quantile_ms(claim, 0.99)
    s = now.sample
    return {
        "at_s": round(now.at - start, 1),
        "jobs_per_s": round((now.finished - prev.finished) / (now.at - prev.at)),
        "backlog": now.backlog,
        "table_mb": round(s["table_bytes"] / 2**20, 2),
        "indexes_mb": round(s["indexes_bytes"] / 2**20, 2),
        "dead_tuples": int(s["dead_tuples"]),
        "live_tuples": int(s["live_tuples"]),
        "autovacuums": int(s["autovacuums"]),
        "claim_p50_ms": None if p50 is None else round(p50, 2),
        "claim_p99_ms": None if p99 is None else round(p99, 2),
        "pg_cpu_us_per_job": round(1e6 * (now.pg_cpu_s - prev.pg_cpu_s) / done, 1),
        "wal_bytes_per_job": round((s["wal_bytes"] - prev.sample["wal_bytes"]) / done),
        "archive_mb": round(s["archive_bytes"] / 2**20, 2),
    }


def _sample(conn: psycopg.Connection[Any]) -> dict[str, float]:
    cur = conn.execute(churn_query("churn_sample"))
    names = [d.name for d in cur.description or ()]
    return {n: float(v or 0) for n, v in zip(names, cur.fetchone() or (), strict=True)}


def retention_pass(conn: psycopg.Connection[Any], completed: str) -> dict[str, Any]:
    """Under keep, every completed row deleted as the pruner deletes them, PASS_BATCH at a time;
    under archive, the janitor's pass, which drops every archive partition wholly in the past. Its
    rows, seconds, WAL, and the dead tuples left once the statistics caught up."""
    wal_before = _sample(conn)["wal_bytes"]
    if completed == "archive":
        deleted = int((conn.execute(churn_query("churn_archive_droppable")).fetchone() or (0,))[0])
        started = time.monotonic()
        conn.execute(churn_query("churn_archive_pass"))
    else:
        started, deleted = time.monotonic(), 0
        batch = churn_query("churn_prune_completed")
        while n := int((conn.execute(batch, {"limit": PASS_BATCH}).fetchone() or (0,))[0]):
            deleted += n
    took_s = time.monotonic() - started
    time.sleep(1.2)  # a backend reports its statistics at most once a second
    after = _sample(conn)
    return {
        "pass_rows": deleted,
        "pass_s": round(took_s, 3),
        "pass_wal_mb": round((after["wal_bytes"] - wal_before) / 2**20, 2),
        "dead_tuples_after_pass": int(after["dead_tuples"]),
        "archive_dead_tuples_after_pass": int(after["archive_dead_tuples"]),
    }


def churn_run(
    dsn: str,
    postmaster: int | None,
    mode: str,
    completed: str,
    *,
    workers: int,
    rate: float,
    seconds: float,
    sample_s: float,
    retention_s: float,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One stream: its interval rows, and its retention pass."""
    rows: list[dict[str, Any]] = []
    print(f"  churn {mode} {completed} x{workers}: {rate:g} jobs/s for {seconds:g} s", flush=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
        with Fleet(
            dsn,
            mode,
            workers,
            profile="defaults",
            completed_jobs=completed,
            completed_retention_s=retention_s,
        ) as fleet:
            fleet.wait_ready()
            producer = Producer(dsn, rate)
            producer.start()
            try:
                start = time.monotonic()
                prev = _reading(conn, fleet, producer, postmaster)
                while (left_s := seconds - (time.monotonic() - start)) > 0.05:
                    time.sleep(min(sample_s, left_s))
                    fleet.check_alive()
                    producer.check()
                    now = _reading(conn, fleet, producer, postmaster)
                    rows.append(_interval(start, prev, now))
                    prev = now
                    print(f"    {rows[-1]}", flush=True)
            finally:
                producer.stop()
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while jobs_left(conn):
                fleet.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the churn's backlog not drained in {DRAIN_TIMEOUT_S:g} s")
                time.sleep(0.2)
        return rows, retention_pass(conn, completed)


def churn_suite(
    dsn: str,
    result: Result,
    *,
    workers: int,
    modes: list[str],
    completed_jobs: tuple[str, ...],
    rate: float,
    seconds: float,
    sample_s: float,
    retention_s: float,
) -> None:
    """Each (completed_jobs, mode) stream in turn: its interval rows, then its pass row."""
    postmaster = postmaster_pid(dsn)
    for completed in completed_jobs:
        for mode in modes:
            rows, passed = churn_run(
                dsn,
                postmaster,
                mode,
                completed,
                workers=workers,
                rate=rate,
                seconds=seconds,
                sample_s=sample_s,
                retention_s=retention_s,
            )
            for row in rows:
                result.add(
                    kind="sample", completed_jobs=completed, mode=mode, workers=workers, **row
                )
            result.add(
                completed_jobs=completed,
                mode=mode,
                workers=workers,
                kind="retention pass",
                **passed,
            )
