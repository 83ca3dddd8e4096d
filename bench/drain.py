"""`drain`: N jobs already queued, drained by W processes, per mode and kind, in interleaved rounds.

Kinds: the runtime (runs.py), the ceiling (`plain_sql`: our statements as plain batched SQL, no
runtime), the minimal table (bench/minimal.py), and with `--completed-jobs` the runtime and the
ceiling with completions that delete. Each row is a kind's median run, with its ratios to the
ceiling and the minimal table at its worker count. Timed on the database clock; how each kind is
timed and why: docs/design/bench-method.md.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from bench import minimal, statements
from bench.core import (
    Result,
    clocked_pair,
    postgres_cpu_seconds,
    postmaster_pid,
    reset,
    run_processes,
    wait_backends_gone,
)
from bench.rounds import median_interval
from bench.runs import measured_run
from dispatcher import enqueue_payloads_sync
from dispatcher.db import (
    COMPLETED_ARCHIVE,
    COMPLETED_DELETE,
    COMPLETED_KEEP,
    MODE_PARTITIONED,
    NUM_BUCKETS,
    RESULTS_CHANNEL,
    claim_sql,
    completion_statements,
    int_array,
    token_array,
)
from dispatcher.devtools.harness import completed_jobs, jobs_left, table_counters

BATCH = 500


def fill(conn: psycopg.Connection[Any], jobs: int) -> None:
    reset(conn)
    enqueue_payloads_sync(conn, "noop", ({} for _ in range(jobs)))


def drain_seconds(conn: psycopg.Connection[Any], table: str = "dispatcher_jobs") -> float:
    """From the first claim to the last completion, read off the completed rows in `table`."""
    row = conn.execute(
        f"SELECT extract(epoch FROM max(completed_at) - min(locked_at))::float8 FROM {table}"
    ).fetchone()
    return float(row[0])  # type: ignore[index]


def row(
    kind: str,
    mode: str,
    workers: int,
    jobs: int,
    seconds: float,
    idx_read: int,
    pg_cpu: float,
    client_cpu: float | None,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "mode": mode,
        "workers": workers,
        "jobs": jobs,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds),
        "idx_reads_per_job": round(idx_read / jobs, 2),
        "pg_cpu_us_per_job": round(pg_cpu / jobs * 1e6, 1),
        "client_cpu_us_per_job": None if client_cpu is None else round(client_cpu / jobs * 1e6, 1),
    }


async def _plain_sql_drainer(
    dsn: str, mode: str, index: int, count: int, completed: str
) -> tuple[Any, Any]:
    """The runtime's own statements with no runtime: one connection claims 500 at a time while a
    second completes the previous batch (the same overlap the runtime's completer gives), raw
    tuples, no Job objects, no handlers. What is left is PostgreSQL's cost of these statements."""
    buckets = (
        tuple(b for b in range(NUM_BUCKETS) if b % count == index)
        if mode == MODE_PARTITIONED
        else None
    )
    claim_statement = claim_sql(buckets)
    # As a worker sends it: fenced (it answers which ids it refused), and under delete and archive
    # closing uniqueness windows (under archive, moving the rows too).
    complete_sql = completion_statements(completed)[False]
    batches: asyncio.Queue[tuple[list[int], list[str]] | None] = asyncio.Queue(maxsize=2)

    async def claimer(conn: psycopg.AsyncConnection[Any]) -> None:
        params = {
            "queue": "default",
            "limit": BATCH,
            "lease_s": 30.0,
            "worker": f"ceiling-{index}",
            "flow_version": None,
        }
        while True:
            token = str(uuid.uuid4())
            rows = await (
                await conn.execute(claim_statement, {**params, "token": token})
            ).fetchall()
            if not rows or rows[0][0] is None:  # the claim's one row of NULLs: nothing left
                await batches.put(None)
                return
            await batches.put(([r[0] for r in rows], [token] * len(rows)))

    async def completer(conn: psycopg.AsyncConnection[Any]) -> None:
        while (batch := await batches.get()) is not None:
            params = {
                "ids": int_array(batch[0]),
                "tokens": token_array(batch[1]),
                "results_channel": RESULTS_CHANNEL,
            }
            await conn.execute(complete_sql, params)

    return await clocked_pair(dsn, claimer, completer)


def plain_sql_drainer(
    dsn: str, mode: str, index: int, count: int, completed: str
) -> tuple[float, Any, Any]:
    """One ceiling process: (its CPU seconds, database clock before its first claim and after its
    last completion)."""
    started = time.process_time()
    first, last = asyncio.run(_plain_sql_drainer(dsn, mode, index, count, completed))
    return time.process_time() - started, first, last


def run_ceiling(
    dsn: str,
    mode: str,
    workers: int,
    jobs: int,
    postmaster: int | None,
    completed: str = COMPLETED_KEEP,
) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill(conn, jobs)
        before = table_counters(conn)
        usage = statements.snapshot(conn) if statements.RECORDING["on"] else None
        pg_cpu = postgres_cpu_seconds(postmaster)
        ran = run_processes(
            plain_sql_drainer, [(dsn, mode, i, workers, completed) for i in range(workers)]
        )
        wait_backends_gone(postmaster, conn)
        pg_cpu = postgres_cpu_seconds(postmaster) - pg_cpu
        delta = table_counters(conn).minus(before)
        by_statement = (
            statements.per_job(statements.minus(statements.snapshot(conn), usage), jobs)
            if usage is not None
            else None
        )
        if completed == COMPLETED_DELETE:
            seconds = (
                max(last for _, _, last in ran) - min(first for _, first, _ in ran)
            ).total_seconds()
            assert jobs_left(conn) == 0, "ceiling drain left jobs behind"
        elif completed == COMPLETED_ARCHIVE:
            seconds = drain_seconds(conn, "dispatcher_jobs_archive")
            assert jobs_left(conn) == 0, "ceiling drain left jobs behind"
        else:
            seconds = drain_seconds(conn)
            assert completed_jobs(conn) == jobs, "ceiling drain left jobs behind"
    result = row(
        _kind("plain_sql", completed),
        mode,
        workers,
        jobs,
        seconds,
        delta.claim_idx_tup_read,
        pg_cpu,
        sum(cpu for cpu, _, _ in ran),
    )
    return {**result, "statements": by_statement} if by_statement is not None else result


def run_minimal(
    dsn: str, kind: str, workers: int, jobs: int, postmaster: int | None
) -> dict[str, Any]:
    """The minimal table's drain (bench/minimal.py), measured as run_ceiling measures ours."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        minimal.fill(conn, jobs)
        usage = statements.snapshot(conn) if statements.RECORDING["on"] else None
        pg_cpu = postgres_cpu_seconds(postmaster)
        client_cpu, seconds = minimal.drain(dsn, kind, workers)
        wait_backends_gone(postmaster, conn)
        pg_cpu = postgres_cpu_seconds(postmaster) - pg_cpu
        by_statement = (
            statements.per_job(statements.minus(statements.snapshot(conn), usage), jobs)
            if usage is not None
            else None
        )
        idx_read = minimal.finish(conn, kind)
    result = row(kind, minimal.MODE, workers, jobs, seconds, idx_read, pg_cpu, client_cpu)
    return {**result, "statements": by_statement} if by_statement is not None else result


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate, plus every run's rate (a 1-second drain is noisy on 2
    cores)."""
    ordered = sorted(runs, key=lambda r: r["jobs_per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["runs_jobs_per_s"] = [r["jobs_per_s"] for r in runs]
    return chosen


def interleaved_rounds(
    modes: list[str], repeat: int, run: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """`repeat` rounds of one run per mode, interleaved so that slow drift hits every mode alike."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(repeat):
        for mode in modes:
            runs[mode].append(run(mode))
    return runs


def add_medians(
    result: Result,
    runs: dict[str, list[dict[str, Any]]],
    ratio: Callable[[dict[str, Any], dict[str, Any]], float],
    compared: tuple[str, ...] = ("partitioned",),
) -> None:
    """Each mode's median run as its row; with several rounds, each `compared` mode's row also
    gets every round's `ratio(its run, skip_locked run)` (above 1: it is faster), their median,
    and an interval for that median (bench/rounds.py)."""
    rows = {}
    for mode, mode_runs in runs.items():
        result.add(**median_run(mode_runs))
        rows[mode] = result.rows[-1]
    for mode in compared:
        if len(runs.get(mode, ())) < 2 or "skip_locked" not in runs:
            continue
        ratios = [ratio(p, s) for p, s in zip(runs[mode], runs["skip_locked"], strict=True)]
        low, high, coverage = median_interval(ratios)
        rows[mode]["rounds_vs_skip_locked"] = [round(r, 2) for r in ratios]
        rows[mode]["median_round_vs_skip_locked"] = round(statistics.median(ratios), 2)
        # e.g. "0.91-1.08 (96%)": where the median ratio lies, distribution-free (bench/rounds.py)
        rows[mode]["median_interval"] = f"{low:.2f}-{high:.2f} ({coverage:.0%})"


def _kind(kind: str, completed: str) -> str:
    """runtime / plain_sql under keep; runtime_delete / plain_sql_delete where completions delete,
    runtime_archive / plain_sql_archive where they archive."""
    return kind if completed == COMPLETED_KEEP else f"{kind}_{completed}"


def drain_suite(
    dsn: str,
    result: Result,
    *,
    jobs: int,
    workers: list[int],
    modes: list[str],
    ceiling: bool = True,
    minimal_table: bool = True,
    repeat: int = 1,
    completed_jobs: tuple[str, ...] = (COMPLETED_KEEP, COMPLETED_DELETE),
) -> None:
    """Per worker count, `repeat` rounds of: each mode's runtime and ceiling (once per value of
    `completed_jobs`), then (`minimal_table`) the minimal table's two kinds, interleaved so that
    slow drift hits every kind alike; then each kind's median run as its row, and the ratios."""
    postmaster = postmaster_pid(dsn)
    for w in workers:
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(repeat):
            for mode in modes:
                for completed in completed_jobs:
                    runtime = measured_run(
                        dsn,
                        mode,
                        w,
                        jobs,
                        postmaster,
                        label=f"drain {mode} x{w} {completed}",
                        completed_jobs=completed,
                    )
                    runs.setdefault((_kind("runtime", completed), mode), []).append(
                        {**runtime, "kind": _kind("runtime", completed)}
                    )
                    if ceiling:
                        runs.setdefault((_kind("plain_sql", completed), mode), []).append(
                            run_ceiling(dsn, mode, w, jobs, postmaster, completed)
                        )
            if minimal_table:
                for kind in minimal.KINDS:
                    runs.setdefault((kind, minimal.MODE), []).append(
                        run_minimal(dsn, kind, w, jobs, postmaster)
                    )
        for kind_runs in runs.values():
            result.add(**median_run(kind_runs))
    add_ratios(result.rows)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each runtime row's `ratio_to_ceiling` (its jobs/s over its mode's plain_sql row's), and each
    runtime and plain_sql row's `ratio_to_minimal` and `ratio_to_minimal_delete` (over the minimal
    kinds' rows of its worker count); the minimal_delete row gets its ratio to minimal too.
    All from medians of the same rounds: ratios are never taken across runs (core.py)."""
    by_key = {(r["kind"], r["mode"], r["workers"]): r for r in rows}

    def ratio(r: dict[str, Any], column: str, kind: str, mode: str) -> None:
        if (limit := by_key.get((kind, mode, r["workers"]))) is not None:
            r[column] = round(r["jobs_per_s"] / limit["jobs_per_s"], 2)

    ours = tuple(f"{k}{s}" for s in ("", "_delete", "_archive") for k in ("runtime", "plain_sql"))
    for r in rows:
        if r["kind"] in ("runtime", "runtime_delete", "runtime_archive"):
            ratio(r, "ratio_to_ceiling", r["kind"].replace("runtime", "plain_sql"), r["mode"])
        if r["kind"] in (*ours, "minimal_delete"):
            ratio(r, "ratio_to_minimal", "minimal", minimal.MODE)
        if r["kind"] in ours:
            ratio(r, "ratio_to_minimal_delete", "minimal_delete", minimal.MODE)
