"""Scenarios beyond drain/enqueue: burst, scaling, skew, jitter, latency (see bench/__main__.py)."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import psycopg

from bench.core import Result, postmaster_pid, reset
from bench.drain import add_medians, interleaved_rounds
from bench.fleet import Fleet
from bench.runs import drain_curve, measured_run
from dispatcher import enqueue_sync


def _lead_s(jobs: int) -> float:
    """How far ahead the burst is scheduled: long enough that enqueueing (~80k/s) ends first."""
    return 1.5 + jobs / 60_000


def burst_suite(
    dsn: str, result: Result, *, jobs: int, workers: int, modes: list[str], repeat: int = 1
) -> None:
    """Idle workers; N jobs all due at one instant T; time from T until all are done. With
    `repeat`, rounds of one run per mode (interleaved, so drift hits both alike); each mode's row
    is its median run, with every round's rate and ratio beside it."""
    postmaster = postmaster_pid(dsn)

    def run(mode: str) -> dict[str, Any]:
        row = measured_run(
            dsn,
            mode,
            workers,
            jobs,
            postmaster,
            label=f"burst {mode} x{workers}",
            delay_s=_lead_s(jobs),
        )
        row["curve"] = drain_curve(dsn, since_due=True)
        return row

    add_medians(
        result,
        interleaved_rounds(modes, repeat, run),
        lambda p, s: p["jobs_per_s"] / s["jobs_per_s"],
    )
    _ratio(result, "jobs_per_s")


def scaling_suite(
    dsn: str, result: Result, *, jobs: int, workers: list[int], modes: list[str], repeat: int = 1
) -> None:
    """The same drain at W = 1, 2, 4, 8, 16 worker PROCESSES: on 2 cores shared with PostgreSQL,
    beyond 2 they mostly measure CPU starvation in throughput, while index reads per claimed job
    show the contention itself, independent of machine noise. Partitioned mode runs twice, with
    stealing at its default (on) and off (`partitioned_no_steal`: the contention-free floor, and
    what stealing costs). With `repeat`, each worker count runs rounds of one run per mode,
    interleaved; each row is its mode's median run, with every round's ratio to SKIP LOCKED
    (from 2 rounds on)."""
    postmaster = postmaster_pid(dsn)
    variants = [*modes, *(["partitioned_no_steal"] if "partitioned" in modes else [])]

    for w in workers:

        def run(variant: str, w: int = w) -> dict[str, Any]:
            if variant == "partitioned_no_steal":
                row = measured_run(
                    dsn,
                    "partitioned",
                    w,
                    jobs,
                    postmaster,
                    label=f"scaling no-steal x{w}",
                    steal="false",
                )
                return {**row, "mode": variant}
            return measured_run(dsn, variant, w, jobs, postmaster, label=f"scaling {variant} x{w}")

        add_medians(
            result,
            interleaved_rounds(variants, repeat, run),
            lambda p, s: p["jobs_per_s"] / s["jobs_per_s"],
            compared=("partitioned", "partitioned_no_steal"),
        )


def skew_suite(dsn: str, result: Result, *, jobs: int, workers: int, modes: list[str]) -> None:
    """80% of the jobs in 2 buckets vs spread evenly; partitioned relies on stealing."""
    postmaster = postmaster_pid(dsn)
    for mode in modes:
        for share in (0.0, 0.8):
            row = measured_run(
                dsn,
                mode,
                workers,
                jobs,
                postmaster,
                label=f"skew {mode} {share:.0%}",
                hot_share=share,
            )
            result.add(hot_share=share, **row)
    for mode in modes:
        even, skewed = (r for r in result.rows if r["mode"] == mode)
        skewed["vs_even"] = round(skewed["seconds"] / even["seconds"], 2)


def jitter_suite(dsn: str, result: Result, *, jobs: int, workers: int, modes: list[str]) -> None:
    """The burst with enqueue jitter 0 s vs 5 s: how late jobs start, how long until all are
    done."""
    postmaster = postmaster_pid(dsn)
    for mode in modes:
        for jitter in (0.0, 5.0):
            row = measured_run(
                dsn,
                mode,
                workers,
                jobs,
                postmaster,
                label=f"jitter {mode} {jitter:g}s",
                delay_s=_lead_s(jobs),
                jitter_s=jitter,
            )
            row["curve"] = drain_curve(dsn, since_due=True)
            result.add(jitter_s=jitter, **row)


def latency_suite(dsn: str, result: Result, *, jobs: int, workers: int, modes: list[str]) -> None:
    """Idle workers polling every 1 s; one job enqueued at a time (own transaction, 20 ms apart):
    add-to-start latency = locked_at - created_at, both on the database clock. Then as many delayed
    jobs (delay_s 0.3-0.7 s, 20 ms apart, so run_ats interleave with enqueues and never fall on a
    poll): start lateness = locked_at - run_at. Without the due timer that lateness is the time to
    the next poll, ~500 ms on average; with it, a claim's round trip."""
    for mode in modes:
        with psycopg.connect(dsn, autocommit=True) as conn:
            reset(conn)
            with Fleet(dsn, mode, workers, poll_interval_s=1.0) as fleet:
                fleet.wait_ready()
                time.sleep(0.5)  # let start-up claims and steals settle: measure idle workers
                for _ in range(jobs):
                    enqueue_sync(conn, "noop")
                    time.sleep(0.02)
                _wait_done(conn, fleet)
                immediate = _ms(conn, "locked_at - created_at")
                conn.execute("DELETE FROM dispatcher_jobs")
                for _ in range(jobs):
                    enqueue_sync(conn, "noop", delay_s=random.uniform(0.3, 0.7))
                    time.sleep(0.02)
                _wait_done(conn, fleet)
                delayed = _ms(conn, "locked_at - run_at")
        result.add(
            mode=mode,
            workers=workers,
            jobs=len(immediate),
            **percentiles("add_to_start", immediate),
            **percentiles("run_at_to_start", delayed),
        )


def _wait_done(conn: psycopg.Connection[Any], fleet: Fleet) -> None:
    deadline = time.monotonic() + 30
    while conn.execute(
        "SELECT count(*) FROM dispatcher_jobs WHERE status <> 'completed'"
    ).fetchone()[0]:  # type: ignore[index]
        fleet.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError("latency jobs not done")
        time.sleep(0.05)


def _ms(conn: psycopg.Connection[Any], interval: str) -> list[float]:
    """`interval` (a fixed expression of this module, never input) of every job, in ms, sorted."""
    return sorted(
        r[0]
        for r in conn.execute(
            f"SELECT 1000 * extract(epoch FROM {interval})::float8 FROM dispatcher_jobs"
        ).fetchall()
    )


def percentiles(name: str, values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (sorted, ms) as `<name>_p50_ms`, ... columns."""
    return {
        f"{name}_p50_ms": round(statistics.median(values), 2),
        f"{name}_p99_ms": round(values[min(len(values) - 1, int(0.99 * len(values)))], 2),
        f"{name}_max_ms": round(values[-1], 2),
    }


def _ratio(result: Result, column: str) -> None:
    by_mode = {r["mode"]: r for r in result.rows}
    if "partitioned" in by_mode and "skip_locked" in by_mode and by_mode["skip_locked"][column]:
        by_mode["partitioned"]["vs_skip_locked"] = round(
            by_mode["partitioned"][column] / by_mode["skip_locked"][column], 2
        )


__all__: list[Any] = ["burst_suite", "jitter_suite", "latency_suite", "scaling_suite", "skew_suite"]
