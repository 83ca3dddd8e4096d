"""Fleets that start or change under load: `coldstart` (workers spawned against a queued backlog,
timed from the spawn) and `rolling` (every worker replaced one at a time during a drain).
What each measures and why: docs/design/bench-method.md.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

from bench.core import Result, postgres_cpu_seconds, postmaster_pid, reset
from bench.drain import add_medians, interleaved_rounds
from bench.fleet import Fleet
from bench.runs import drain_curve, enqueue_jobs
from dispatcher.devtools.harness import completed_jobs, progress, table_counters, watch_until_done

PROFILE_NAMES = ("defaults", "bench")
WINDOW_S = 0.5  # throughput window of the rolling dip
WINDOW = timedelta(seconds=WINDOW_S)


def coldstart_suite(
    dsn: str,
    result: Result,
    *,
    jobs: int,
    workers: list[int],
    modes: list[str],
    profiles: tuple[str, ...] = PROFILE_NAMES,
    repeat: int = 1,
) -> None:
    """With `repeat`, rounds of one run per mode (interleaved, so drift hits both alike); each
    mode's row is its median run, with every round's rate, and every round's ratio beside it: a
    cold start of 5-9 s moves by up to +-30% from round to round on 2 cores."""
    postmaster = postmaster_pid(dsn)
    for profile in profiles:
        for w in workers:
            runs = interleaved_rounds(
                modes,
                repeat,
                lambda mode, w=w, profile=profile: coldstart_run(
                    dsn, mode, w, jobs, postmaster, profile=profile
                ),
            )
            add_medians(result, runs, lambda p, s: s["spawn_to_done_s"] / p["spawn_to_done_s"])
    _ratios(result, ("profile", "workers"), "spawn_to_done_s")


def coldstart_run(
    dsn: str,
    mode: str,
    workers: int,
    jobs: int,
    postmaster: int | None,
    *,
    profile: str,
    timeout_s: float = 900,
) -> dict[str, Any]:
    label = f"coldstart {mode} x{workers} {profile}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
        enqueue_jobs(conn, jobs)
        # A backlog that has waited a while: written out and analysed, as it would be by the time
        # a fleet comes back (and the same for both modes: no run pays for the other's checkpoint).
        conn.execute("CHECKPOINT")
        conn.execute("VACUUM ANALYZE dispatcher_jobs")
        before = table_counters(conn)
        spawned_at = _now(conn)
        pg_cpu = postgres_cpu_seconds(postmaster)
        with Fleet(dsn, mode, workers, profile=profile) as fleet:
            max_waiters = watch_until_done(
                conn, fleet, jobs, label, timeout_s=timeout_s, every_s=0.05
            )
            worker_cpu = fleet.cpu_seconds()
            pg_cpu = postgres_cpu_seconds(postmaster) - pg_cpu
        # after the workers exited: their statistics are flushed
        counted = table_counters(conn).minus(before)
        first_claim, to_done, twice = conn.execute(
            """SELECT extract(epoch FROM min(locked_at) - %(t)s)::float8,
                      extract(epoch FROM max(completed_at) - %(t)s)::float8,
                      count(*) FILTER (WHERE attempts > 1)
                 FROM dispatcher_jobs""",
            {"t": spawned_at},
        ).fetchone()  # type: ignore[misc]
    return {
        "mode": mode,
        "profile": profile,
        "workers": workers,
        "jobs": jobs,
        "spawn_to_first_claim_s": round(first_claim, 3),
        "spawn_to_done_s": round(to_done, 3),
        "drain_s": round(to_done - first_claim, 3),
        "jobs_per_s": round(jobs / to_done),
        "ran_twice": int(twice),
        "max_lock_waiters": max_waiters,
        "autovacuums": counted.autovacuums,
        "pg_cpu_us_per_job": round(pg_cpu / jobs * 1e6, 1),
        "client_cpu_us_per_job": round(worker_cpu / jobs * 1e6, 1),
    }


def rolling_suite(
    dsn: str,
    result: Result,
    *,
    jobs: int,
    workers: int,
    modes: list[str],
    profiles: tuple[str, ...] = PROFILE_NAMES,
) -> None:
    for profile in profiles:
        for mode in modes:
            row = rolling_run(dsn, mode, workers, jobs, profile=profile)
            row["curve"] = drain_curve(dsn, since_due=False)
            result.add(**row)
    _ratios(result, ("profile", "workers"), "seconds")


def rolling_run(
    dsn: str, mode: str, workers: int, jobs: int, *, profile: str, timeout_s: float = 900
) -> dict[str, Any]:
    label = f"rolling {mode} x{workers} {profile}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
        with Fleet(dsn, mode, workers, profile=profile) as fleet:
            fleet.wait_ready()
            enqueue_jobs(conn, jobs)
            started, done = time.monotonic(), 0

            def watch() -> int:
                fleet.check_alive()
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"{label}: {jobs - done} jobs left after {timeout_s} s")
                return completed_jobs(conn)

            # Steady state first (a fifth of the jobs), then replace every worker, oldest first.
            while (done := watch()) < jobs // 5:
                time.sleep(0.05)
            rollout_started = _now(conn)
            stop_s = []
            for _ in range(workers):
                new = fleet.spawn()
                while not fleet.worker_ready(new):
                    watch()
                    time.sleep(0.05)
                stopping = time.monotonic()
                code = fleet.retire(0)
                if code != 0:
                    raise RuntimeError(f"{label}: a retired worker exited with code {code}")
                stop_s.append(time.monotonic() - stopping)
            rollout_ended = _now(conn)
            while (done := watch()) < jobs:
                progress(label, done, jobs, time.monotonic() - started)
                time.sleep(0.05)
            progress(label, done, jobs, time.monotonic() - started)
        # Every figure from the database clock (completed_at), not from this loop's samples: the
        # loop cannot sample while it waits for a retired worker to exit.
        first, last, twice, lost = conn.execute(
            """SELECT min(locked_at), max(completed_at), count(*) FILTER (WHERE attempts > 1),
                      count(*) FILTER (WHERE status <> 'completed') FROM dispatcher_jobs"""
        ).fetchone()  # type: ignore[misc]
        steady_s = (rollout_started - first).total_seconds()
        steady = _count_completed(conn, first, rollout_started) / steady_s if steady_s > 0 else None
        # The dip is read while jobs were left: a rollout that outlasts the drain has idle windows.
        during, t = [], rollout_started
        while t + WINDOW < min(rollout_ended, last):
            during.append(_count_completed(conn, t, t + WINDOW) / WINDOW_S)
            t += WINDOW
    spread = (last - first).total_seconds()
    return {
        "mode": mode,
        "profile": profile,
        "workers": workers,
        "jobs": jobs,
        "seconds": round(spread, 3),
        "jobs_per_s": round(jobs / spread),
        "rollout_s": round((rollout_ended - rollout_started).total_seconds(), 2),
        "rollout_share_of_drain": round(
            (min(rollout_ended, last) - rollout_started) / (last - first), 2
        ),
        "steady_jobs_per_s": round(steady) if steady else None,
        "dip_jobs_per_s": round(min(during)) if during else None,
        "dip_vs_steady": round(min(during) / steady, 2) if during and steady else None,
        "ran_twice": int(twice),
        "not_completed": int(lost),
        "stop_max_s": round(max(stop_s), 2),
    }


def _now(conn: psycopg.Connection[Any]) -> datetime:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index,no-any-return]


def _count_completed(conn: psycopg.Connection[Any], since: datetime, until: datetime) -> int:
    row = conn.execute(
        "SELECT count(*) FROM dispatcher_jobs WHERE completed_at >= %s AND completed_at < %s",
        (since, until),
    ).fetchone()
    return int(row[0]) if row else 0


def _ratios(result: Result, keys: tuple[str, ...], column: str) -> None:
    """partitioned vs skip_locked per configuration: skip_locked's time / partitioned's time
    (above 1: partitioned is faster)."""
    groups: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for row in result.rows:
        groups.setdefault(tuple(row[k] for k in keys), {})[row["mode"]] = row
    for by_mode in groups.values():
        if "partitioned" in by_mode and "skip_locked" in by_mode and by_mode["partitioned"][column]:
            by_mode["partitioned"]["vs_skip_locked"] = round(
                by_mode["skip_locked"][column] / by_mode["partitioned"][column], 2
            )
