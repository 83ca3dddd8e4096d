"""One measured run of the real runtime: a ready fleet, a batch of jobs, the figures.

Shape of every runtime run:
1. start W worker processes and wait until they are ready (all 64 buckets owned), idle;
2. commit N jobs at once: due now (drain) or due at one future instant T (burst, jitter);
3. watch until all are done (progress bar, lock waiters sampled from pg_stat_activity);
4. read the figures: times from the database clock (first claim or T, to the last completion),
   claim / poll-cycle quantiles from the workers' histograms, index and heap reads per job
   from pg_stat deltas, dead tuples at the end, CPU seconds of PostgreSQL and of the workers over
   the drain alone, as the plain-SQL ceiling's (costs.py), plus start-up and idle CPU apart.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import psycopg

from bench import pyspy, statements
from bench.core import reset, wait_backends_gone
from bench.costs import CostMeter
from bench.fleet import Fleet, quantile_ms
from coordinator.pg.sqlfile import load
from dispatcher import JobSpec, enqueue_many_sync, enqueue_payloads_sync
from dispatcher.db import COMPLETED_ARCHIVE, COMPLETED_DELETE, query
from dispatcher.devtools.harness import db_clock, table_counters, watch_until_done


def enqueue_jobs(
    conn: psycopg.Connection[Any],
    jobs: int,
    *,
    delay_s: float = 0.0,
    jitter_s: float = 0.0,
    hot_share: float = 0.0,
    ordering_keys: list[str] | None = None,
) -> None:
    """N no-op jobs in one transaction; `hot_share` of them in buckets 0 and 1 (the skew), or
    each with its ordering key (bench/keyed.py: through the staging table)."""
    if ordering_keys is not None:
        enqueue_payloads_sync(
            conn,
            "noop",
            ({} for _ in range(jobs)),
            delay_s=delay_s,
            jitter_s=jitter_s,
            ordering_keys=ordering_keys,
        )
    elif hot_share:
        hot = int(jobs * hot_share)
        specs = [
            JobSpec("noop", bucket=i % 2, delay_s=delay_s, jitter_s=jitter_s) for i in range(hot)
        ]
        specs += [
            JobSpec("noop", bucket=2 + i % 62, delay_s=delay_s, jitter_s=jitter_s)
            for i in range(jobs - hot)
        ]
        enqueue_many_sync(conn, specs)
    else:
        enqueue_payloads_sync(
            conn, "noop", ({} for _ in range(jobs)), delay_s=delay_s, jitter_s=jitter_s
        )


def measured_run(
    dsn: str,
    mode: str,
    workers: int,
    jobs: int,
    postmaster: int | None,
    *,
    label: str,
    delay_s: float = 0.0,
    jitter_s: float = 0.0,
    hot_share: float = 0.0,
    ordering_keys: list[str] | None = None,
    timeout_s: float = 900,
    **settings: Any,
) -> dict[str, Any]:
    # Completions that delete leave no timestamps: such a drain is timed from the commit of its
    # jobs until the watch finds none left, up to 0.1 s late (drain.py's docstring). Not polled
    # faster: each count scans the table, and every 20 ms cost a 1-worker drain 12% of its rate.
    deleting = settings.get("completed_jobs") == COMPLETED_DELETE and not delay_s
    # Under archive the completed rows, timestamps and all, are in the archive.
    archived = settings.get("completed_jobs") == COMPLETED_ARCHIVE
    finished = "dispatcher_jobs_archive" if archived else "dispatcher_jobs"
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
        with Fleet(dsn, mode, workers, **settings) as fleet:
            fleet.wait_ready()
            start_cpu_s = fleet.cpu_seconds() / workers
            meter = CostMeter(conn, postmaster, fleet)
            idle = meter.idle(1.0)
            with conn.transaction():  # the jobs appear at once, when it commits
                enqueue_jobs(
                    conn,
                    jobs,
                    delay_s=delay_s,
                    jitter_s=jitter_s,
                    hot_share=hot_share,
                    ordering_keys=ordering_keys,
                )
                conn.execute(query("jobs_analyze"))  # as enqueue does after a bulk COPY of its own
                if not delay_s:
                    # The jobs can be claimed from the commit on (costs.py); the table counters
                    # start here too. While a COPY is uncommitted, each idle poll walks the index
                    # entries it has inserted so far in its buckets (they are not yet visible, so
                    # nothing stops the walk early); a backend flushes what it counted up to a
                    # second late, so up to a second of those reads still lands in the drain's.
                    before, ordering_before = (
                        table_counters(conn),
                        _ordering_reads(conn, ordering_keys),
                    )
                    meter.start()
            committed_at = db_clock(conn)
            due_after_commit_s = None
            if delay_s:
                due_after_commit_s = _sleep_until_due(conn)
                before, ordering_before = table_counters(conn), _ordering_reads(conn, ordering_keys)
                meter.start()
            sampler = _sampler(fleet, label)
            try:
                max_waiters = watch_until_done(
                    conn, fleet, jobs, label, timeout_s=timeout_s, every_s=0.1
                )
                ended_at = db_clock(conn)
                costs = meter.stop()
            finally:
                if sampler is not None:
                    sampler.stop()
            # The fleet stays up, idle, while the table counters settle: backends flush their
            # statistics at most once a second (hence the 1.2 s), and stopping the fleet first
            # would count its shutdown too (the last worker standing briefly owns all 64
            # buckets and claims through the queue-wide index: 20k reads after the work is done).
            time.sleep(1.2)
            histograms = fleet.histograms()
            stolen = fleet.counter("dispatcher_jobs_stolen_total")
            delta = table_counters(conn).minus(before)
        if ordering_keys is not None:
            # Read once the fleet has exited: a backend flushes its counts at exit, while an idle
            # one (a completer's, after its last batch) may hold them for up to 10 s. The shutdown
            # promotes nothing: no job is left.
            wait_backends_gone(postmaster, conn)
            ordering_reads = _ordering_reads(conn, ordering_keys) - ordering_before
        timing = (
            ((ended_at - committed_at).total_seconds(), None, None, None, None)
            if deleting
            else conn.execute(
                f"""SELECT extract(epoch FROM max(completed_at) - min(locked_at))::float8,
                      extract(epoch FROM max(completed_at) - min(run_at))::float8,
                      extract(epoch FROM max(run_at) - min(run_at))::float8,
                      1000 * percentile_cont(0.5)
                             WITHIN GROUP (ORDER BY extract(epoch FROM locked_at - run_at)),
                      1000 * percentile_cont(0.99)
                             WITHIN GROUP (ORDER BY extract(epoch FROM locked_at - run_at))
                 FROM {finished}"""
            ).fetchone()
        )
        dead = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dispatcher_jobs'"
        ).fetchone()
    drain_s, from_due_s, due_spread_s, late_p50, late_p99 = timing  # type: ignore[misc]
    claim = histograms.get("dispatcher_claim_seconds", [])
    cycle = histograms.get("dispatcher_poll_cycle_seconds", [])
    return {
        "kind": "runtime",
        "mode": mode,
        "workers": workers,
        "jobs": jobs,
        "seconds": round(drain_s, 3),
        "jobs_per_s": round(jobs / drain_s),
        "due_to_done_s": _r(from_due_s, 3),
        "due_spread_s": _r(due_spread_s, 3),
        "due_after_commit_s": _r(due_after_commit_s),
        # How long after its due time each job started (queueing delay during a burst).
        "start_late_p50_ms": _r(late_p50),
        "start_late_p99_ms": _r(late_p99),
        "claim_p50_ms": _r(quantile_ms(claim, 0.5)),
        "claim_p99_ms": _r(quantile_ms(claim, 0.99)),
        "poll_p50_ms": _r(quantile_ms(cycle, 0.5)),
        "poll_p99_ms": _r(quantile_ms(cycle, 0.99)),
        "stolen_share": round(stolen / jobs, 3),  # of the jobs, how many a thief took (partitioned)
        "idx_reads_per_job": round(delta.claim_idx_tup_read / jobs, 2),
        "heap_fetch_per_job": round(delta.idx_tup_fetch / jobs, 2),
        **(
            {"ordering_idx_reads_per_job": round(ordering_reads / jobs, 2)}
            if ordering_keys is not None
            else {}
        ),
        "max_lock_waiters": max_waiters,
        "dead_tuples_end": int(dead[0]) if dead else None,
        "pg_cpu_us_per_job": round(costs.pg_cpu_s / jobs * 1e6, 1),
        "client_cpu_us_per_job": round(costs.client_cpu_s / jobs * 1e6, 1),
        "client_start_cpu_s": round(start_cpu_s, 2),
        **idle,
        "autovacuums": delta.autovacuums,
        **(
            {"statements": statements.per_job(costs.statements, jobs)}
            if costs.statements is not None
            else {}
        ),
        **(
            {"py_spy": pyspy.top(sampler.path.read_text(), costs.client_cpu_s / jobs * 1e6)}
            if sampler
            else {}
        ),
    }


def _ordering_reads(conn: psycopg.Connection[Any], ordering_keys: list[str] | None) -> int:
    """Index entries read so far through the ordering indexes (bench/sql/keyed.sql), our own
    session's flushed first: its keyed enqueue read them too, before the window. 0 for a run
    without keys (not read)."""
    if ordering_keys is None:
        return 0
    sql = load("bench", "keyed.sql")
    # Flushed as the session goes idle after it. Before PostgreSQL 15 (no such function): up to
    # a second of the enqueue's reads may land in the window.
    with contextlib.suppress(psycopg.errors.UndefinedFunction):
        conn.execute(sql["keyed_flush_own_stats"])
    row = conn.execute(sql["keyed_ordering_index_reads"]).fetchone()
    return int(row[0]) if row else 0


def _sampler(fleet: Fleet, label: str) -> pyspy.Sampler | None:
    """py-spy on the first worker from now on (`--py-spy`), or None."""
    out_dir = pyspy.RECORDING["dir"]
    if out_dir is None:
        return None
    sampler = pyspy.Sampler(
        fleet.procs[0].pid, out_dir / (re.sub(r"\W+", "-", label).strip("-") + ".pyspy.raw")
    )
    sampler.start()
    return sampler


def _sleep_until_due(conn: psycopg.Connection[Any]) -> float:
    """Until just before the first job is due (database clock): the window of a burst opens there.
    Returns how long that was (negative: the jobs were due before they committed, and the burst's
    figures count some of the enqueue: give it a longer lead)."""
    row = conn.execute(
        "SELECT extract(epoch FROM min(run_at) - clock_timestamp())::float8 FROM dispatcher_jobs"
    ).fetchone()
    margin = float(row[0])  # type: ignore[index]
    time.sleep(max(0.0, margin - 0.02))
    return margin


def drain_curve(dsn: str, since_due: bool, bins_s: float = 0.1) -> list[tuple[float, int]]:
    """(seconds after the first claim, or after the due instant; jobs completed by then)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # t0 first, on its own: as a CTE joined to the rows, stale statistics (1 completed row
        # estimated, 60k there) made it a nested loop that re-ran min() per row, for minutes.
        start = "min(run_at)" if since_due else "min(locked_at)"
        t0 = conn.execute(f"SELECT {start} FROM dispatcher_jobs").fetchone()[0]  # type: ignore[index]
        rows = conn.execute(
            """SELECT floor(extract(epoch FROM completed_at - %s) / %s)::int AS bin, count(*)
                 FROM dispatcher_jobs WHERE status = 'completed' GROUP BY 1 ORDER BY 1""",
            (t0, bins_s),
        ).fetchall()
    curve, total = [], 0
    for bin_index, count in rows:
        total += count
        curve.append((round((bin_index + 1) * bins_s, 3), total))
    return curve


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
