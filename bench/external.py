"""`python -m bench burst --external-workers` (or BENCH_EXTERNAL_WORKERS=1): the burst against a
fleet that runs elsewhere, such as N pods of a deployment, measured from the database alone.
Its safeguards (live workers, its own rows only, clean-up) and figures: docs/design/bench-method.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from bench.core import Result, machine
from bench.fleetview import FleetSampler, claim_sessions, live_members
from coordinator.pg.dsn import describe_dsn, one_line
from dispatcher import DispatcherError, enqueue_payloads_sync, enqueue_sync
from dispatcher.devtools.harness import TableCounters, progress, table_counters

T = TypeVar("T")
ENV_FLAG = "BENCH_EXTERNAL_WORKERS"
SCENARIO = "burst_external"
TAG = "bench_run"  # the payload key naming the run that enqueued a job
EXIT_FAILED, EXIT_REFUSED = 1, 2
# An idle backend flushes its statistics at most 10 s after its last statement (PostgreSQL 15+,
# PGSTAT_IDLE_INTERVAL; a busy one every second): a worker's completion connection can go quiet
# right after the last flush, so the closing counters are read 11 s after the last completion.
SETTLE_S = 11.0
# no job completed for this long after T, while jobs are left: the fleet is not working
STALL_S = 120.0
DELETE_BATCH = 10_000
_NO_ID = 2**63 - 1
COLUMNS = [
    "mode",
    "workers",
    "workers_connected",
    "jobs",
    "seconds",
    "jobs_per_s",
    "due_to_done_s",
    "start_late_p50_ms",
    "start_late_p99_ms",
    "idx_reads_per_job",
    "heap_fetch_per_job",
    "max_lock_waiters",
    "dead_tuples_end",
]

# This session's statistics not yet flushed to the shared counters (PostgreSQL 15+: earlier
# transactions' too). A flush happens only between transactions, so two readings within one
# transaction bracket exactly what ran between them.
_PENDING_READS = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid))
                FILTER (WHERE c.relname LIKE 'dispatcher_jobs_claim%'), 0)::bigint,
       (coalesce(sum(pg_stat_get_xact_tuples_fetched(i.indexrelid)), 0)
        + pg_stat_get_xact_tuples_fetched('dispatcher_jobs'::regclass))::bigint
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'dispatcher_jobs'::regclass"""
# The run's rows: a primary-key range (never a scan of the queue's other rows), then queue and tag.
_OURS = (
    "id > %(lo)s AND id <= %(hi)s AND queue_name = %(queue)s AND payload->>'bench_run' = %(run)s"
)


class Refused(Exception):
    """The bench will not run: nothing of its own is left in the table."""


@dataclass(frozen=True, slots=True)
class Options:
    jobs: int
    queue: str = "bench"
    job_type: str = "noop"
    timeout_s: float = 900.0
    probe_timeout_s: float = 30.0
    lead_s: float | None = None
    keep_rows: bool = False

    def lead(self) -> float:
        """How long after the enqueue begins the jobs fall due: the COPY must commit first (80k
        jobs/s on one machine, less over a network; lead_margin_s in the row says what was left)."""
        return self.lead_s if self.lead_s is not None else 2.0 + self.jobs / 20_000


@dataclass
class Ours:
    """Which rows are the run's: ids in (lo, hi], the queue, the tag."""

    lo: int
    queue: str
    run: str
    hi: int = _NO_ID  # until the enqueue has returned its last id

    def params(self, **more: Any) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "queue": self.queue, "run": self.run, **more}


@dataclass
class OwnReads:
    """The bench's own reads of the jobs table that land in the measured window."""

    claim_idx_reads: int = 0
    heap_fetches: int = 0

    @staticmethod
    def pending(conn: psycopg.Connection[Any]) -> tuple[int, int]:
        row = conn.execute(_PENDING_READS).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def add(self, reads: tuple[int, int], sign: int = 1) -> None:
        self.claim_idx_reads += sign * reads[0]
        self.heap_fetches += sign * reads[1]

    def measured(self, conn: psycopg.Connection[Any], work: Callable[[], T]) -> T:
        with conn.transaction():
            before = self.pending(conn)
            result = work()
            after = self.pending(conn)
        self.add((after[0] - before[0], after[1] - before[1]))
        return result


@dataclass
class Watch:
    """What the wait loop keeps: the fleet sampler, the bench's own reads, the last completion."""

    sampler: FleetSampler = field(default_factory=FleetSampler)
    own: OwnReads = field(default_factory=OwnReads)
    failed: int = 0
    last_completed_at: Any = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("a fleet that runs elsewhere (burst only; bench/external.py)")
    group.add_argument(
        "--external-workers",
        action="store_true",
        default=os.environ.get(ENV_FLAG, "").lower() in ("1", "true", "yes"),
        help=f"start no worker: measure the live ones on --dsn (also {ENV_FLAG}=1)",
    )
    group.add_argument(
        "--queue", default="bench", help="the dedicated queue the workers serve (default bench)"
    )
    group.add_argument(
        "--job-type", default="noop", help="a job type the workers run as a no-op (default noop)"
    )
    group.add_argument(
        "--timeout-s", type=float, default=900.0, help="give up after this long (default 900)"
    )
    group.add_argument(
        "--probe-timeout-s",
        type=float,
        default=30.0,
        help="how long the probe job may wait for a worker (default 30)",
    )
    group.add_argument(
        "--lead-s",
        type=float,
        default=None,
        help="seconds from the enqueue to T (default 2 + N/20,000)",
    )
    group.add_argument(
        "--keep-rows",
        action="store_true",
        help="leave the run's rows to retention instead of deleting them",
    )


def main(args: argparse.Namespace, scenarios: list[str]) -> int:
    if scenarios != ["burst"]:
        return _say("--external-workers runs the burst scenario only", EXIT_REFUSED)
    if not args.dsn:
        return _say(
            "--external-workers measures the fleet's database: give --dsn or DISPATCHER_DSN",
            EXIT_REFUSED,
        )
    # A Job's deadline or `kubectl delete` sends SIGTERM: unwind, so the run's rows are deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    opts = Options(
        jobs=args.jobs or (3_000 if args.quick else 200_000),
        queue=args.queue,
        job_type=args.job_type,
        timeout_s=args.timeout_s,
        probe_timeout_s=args.probe_timeout_s,
        lead_s=args.lead_s,
        keep_rows=args.keep_rows,
    )
    where = describe_dsn(args.dsn)
    result = Result(SCENARIO)
    try:
        print(f"\n== burst against the live workers of {where}, queue {opts.queue!r}", flush=True)
        row = burst(args.dsn, opts)
        note = "the bench driver's machine; the workers and PostgreSQL run elsewhere"
        result.machine = {**machine(args.dsn), "database": where, "note": note}
    except Refused as exc:
        return _say(f"refused: {exc}", EXIT_REFUSED)
    except (psycopg.Error, DispatcherError, TimeoutError, RuntimeError) as exc:
        return _say(f"failed: {one_line(exc, args.dsn)}", EXIT_FAILED)
    curve = row.pop("curve")
    result.add(**row)
    result.rows[-1]["curve"] = curve
    print()
    print(result.table(COLUMNS))
    print(f"written: {result.save(args.out)}", flush=True)
    _plot(result, args.out, opts)
    # one line for scripts reading the logs
    print("result " + json.dumps(row, default=str), flush=True)
    if row["failed_jobs"]:
        return _say(
            f"failed: {row['failed_jobs']} jobs ended failed, discarded or cancelled", EXIT_FAILED
        )
    return 0


def burst(dsn: str, opts: Options) -> dict[str, Any]:
    """Check the fleet, probe it, enqueue the burst, wait, measure, delete the run's rows."""
    run = uuid.uuid4().hex[:12]
    with psycopg.connect(
        dsn, autocommit=True, application_name="dispatcher-bench", connect_timeout=10
    ) as conn:
        # nothing may hang: our statements take milliseconds
        conn.execute("SET statement_timeout = '60s'")
        if conn.execute("SELECT to_regclass('dispatcher_jobs')").fetchone()[0] is None:  # type: ignore[index]
            raise Refused(
                f"no dispatcher_jobs table on {describe_dsn(dsn)}: run `dispatcher migrate` first"
            )
        workers = len(claim_sessions(conn))
        if not workers:
            raise Refused(
                f"no live worker on {describe_dsn(dsn)}: no session has application_name "
                f"'dispatcher-claim'; start the workers (serving queue {opts.queue!r}) first"
            )
        busy = conn.execute(
            "SELECT count(*) FROM dispatcher_jobs WHERE queue_name = %s AND status IN "
            "('queued', 'running')",
            (opts.queue,),
        ).fetchone()[0]  # type: ignore[index]
        if busy:
            raise Refused(
                f"queue {opts.queue!r} holds {busy} unfinished jobs "
                "(another bench run, or leftovers): wait until the workers have run them"
            )
        watch = Watch()
        watch.sampler.sample(conn)
        probe_s = _probe(conn, opts, run, watch.sampler)
        members = live_members(conn, opts.queue)
        with conn.transaction():
            before = table_counters(conn)
            # Reads of ours still pending now reach the shared counters inside the window.
            watch.own.add(OwnReads.pending(conn))
        ours = Ours(_sequence(conn, "nextval"), opts.queue, run)
        watch.sampler.max_lock_waiters = 0  # the run's, from here
        try:
            started = time.monotonic()
            enqueue_payloads_sync(
                conn,
                opts.job_type,
                ({TAG: run} for _ in range(opts.jobs)),
                queue=opts.queue,
                delay_s=opts.lead(),
            )
            enqueue_s = time.monotonic() - started
            ours.hi = _sequence(conn, "currval")
            committed_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            _wait(conn, ours, opts, watch, due_in_s=opts.lead() - enqueue_s)
            # The closing counters, once every backend has flushed: reads still pending in this
            # session are not in them (read first: no flush happens inside a transaction).
            time.sleep(max(0.0, SETTLE_S - _seconds_since(conn, watch.last_completed_at)))
            with conn.transaction():
                watch.own.add(OwnReads.pending(conn), sign=-1)
                after = table_counters(conn)
            row = _figures(conn, ours, opts, before, after, watch)
            row.update(
                workers_connected=workers,
                coordinator_members=members,
                probe_s=round(probe_s, 3),
                enqueue_s=round(enqueue_s, 3),
                lead_s=round(opts.lead(), 3),
                lead_margin_s=round((row.pop("due_at") - committed_at).total_seconds(), 3),
            )
        finally:
            deleted = None if opts.keep_rows else _delete(conn, ours)
        row["rows_deleted"] = deleted
        return row


def _probe(conn: psycopg.Connection[Any], opts: Options, run: str, sampler: FleetSampler) -> float:
    """One job that some worker must run within probe_timeout_s; deleted whatever happens."""
    job_id = enqueue_sync(conn, opts.job_type, {TAG: run, "probe": True}, queue=opts.queue)
    started = time.monotonic()
    try:
        while True:
            row = conn.execute(
                "SELECT status, last_error FROM dispatcher_jobs WHERE id = %s", (job_id,)
            ).fetchone()
            status, error = row if row else ("deleted", None)
            sampler.sample(conn)
            if status == "completed":
                return time.monotonic() - started
            if error or status in ("failed", "discarded", "cancelled"):
                raise Refused(
                    f"the probe job ({opts.job_type!r} on queue {opts.queue!r}) "
                    f"did not succeed: {error}"
                )
            if time.monotonic() - started > opts.probe_timeout_s:
                raise Refused(
                    f"no worker ran a probe job ({opts.job_type!r}) on queue {opts.queue!r} within "
                    f"{opts.probe_timeout_s:g} s ({status}): do the workers serve that queue "
                    "(DISPATCHER_QUEUES) and have a handler for that job type?"
                )
            time.sleep(0.05)
    finally:
        conn.execute(
            "DELETE FROM dispatcher_jobs WHERE id = %s AND queue_name = %s", (job_id, opts.queue)
        )
        conn.execute("DELETE FROM dispatcher_job_attempts WHERE job_id = %s", (job_id,))


def _sequence(conn: psycopg.Connection[Any], function: str) -> int:
    """nextval (an id below all the run's) or currval (the last id this session's enqueue got)."""
    # a fixed name, never input
    sql = f"SELECT {function}(pg_get_serial_sequence('dispatcher_jobs', 'id'))"
    return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def _seconds_since(conn: psycopg.Connection[Any], moment: Any) -> float:
    if moment is None:
        return SETTLE_S
    row = conn.execute("SELECT extract(epoch FROM now() - %s)::float8", (moment,)).fetchone()
    return float(row[0]) if row else SETTLE_S


_PROGRESS = f"""SELECT count(*), count(*) FILTER (WHERE status = 'completed'),
                       count(*) FILTER (WHERE status IN ('failed', 'discarded', 'cancelled')),
                       max(completed_at)
                  FROM dispatcher_jobs WHERE {_OURS}"""


def _wait(
    conn: psycopg.Connection[Any], ours: Ours, opts: Options, watch: Watch, *, due_in_s: float
) -> None:
    """Until every job of the run has ended; TimeoutError past timeout_s, or after STALL_S (from T)
    without a completion."""
    started = time.monotonic()
    due_at, last_done, last_change = started + due_in_s, -1, started
    while True:
        polled = time.monotonic()
        total, done, failed, watch.last_completed_at = watch.own.measured(
            conn, lambda: conn.execute(_PROGRESS, ours.params()).fetchone()
        )  # type: ignore[misc]
        poll_s = time.monotonic() - polled
        watch.sampler.sample(conn)
        progress(f"burst on {opts.queue}", done + failed, opts.jobs, time.monotonic() - started)
        if total != opts.jobs:
            raise RuntimeError(
                f"{total} of the run's {opts.jobs} jobs are in the table: were some deleted?"
            )
        watch.failed = failed
        if done + failed >= opts.jobs:
            return
        now = time.monotonic()
        if done != last_done:
            last_done, last_change = done, now
        elif now - max(last_change, due_at) > STALL_S:
            raise TimeoutError(
                f"no job completed for {STALL_S:g} s: {opts.jobs - done} of {opts.jobs} left "
                f"({len(claim_sessions(conn))} worker processes connected)"
            )
        if now - started > opts.timeout_s:
            raise TimeoutError(
                f"{opts.jobs - done} of {opts.jobs} jobs not done after {opts.timeout_s:g} s"
            )
        # The count costs about 0.3 us a row: polling no more often than 4x its duration keeps it
        # under a fifth of one backend's time.
        time.sleep(max(0.1, 4 * poll_s))


def _figures(
    conn: psycopg.Connection[Any],
    ours: Ours,
    opts: Options,
    before: TableCounters,
    after: TableCounters,
    watch: Watch,
) -> dict[str, Any]:
    (jobs, retried, ran, drain_s, from_due_s, late_p50, late_p99, late_max, due_at) = conn.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE attempts > 1), count(DISTINCT locked_by),
                   extract(epoch FROM max(completed_at) - min(locked_at))::float8,
                   extract(epoch FROM max(completed_at) - min(run_at))::float8,
                   1000 * percentile_cont(0.5)
                          WITHIN GROUP (ORDER BY extract(epoch FROM locked_at - run_at)),
                   1000 * percentile_cont(0.99)
                          WITHIN GROUP (ORDER BY extract(epoch FROM locked_at - run_at)),
                   1000 * extract(epoch FROM max(locked_at - run_at))::float8,
                   min(run_at)
              FROM dispatcher_jobs WHERE {_OURS}""",
        ours.params(),
    ).fetchone()  # type: ignore[misc]
    # Share of each bucket's jobs run by the worker that ran most of them: ~1 when each bucket has
    # one owner (partitioned), ~1/W when every worker claims from every bucket (SKIP LOCKED).
    share = conn.execute(
        f"""SELECT sum(top)::float8 / nullif(sum(total), 0) FROM (
                SELECT max(n) AS top, sum(n) AS total FROM (
                    SELECT bucket, locked_by, count(*) AS n
                      FROM dispatcher_jobs WHERE {_OURS} GROUP BY 1, 2
                ) AS per_worker GROUP BY bucket) AS per_bucket""",
        ours.params(),
    ).fetchone()[0]  # type: ignore[index]
    curve = conn.execute(
        f"""SELECT floor(extract(epoch FROM completed_at - %(t0)s) / 0.1)::int, count(*)
              FROM dispatcher_jobs WHERE {_OURS} AND status = 'completed' GROUP BY 1 ORDER BY 1""",
        ours.params(t0=due_at),
    ).fetchall()
    claim_reads = after.claim_idx_tup_read - before.claim_idx_tup_read - watch.own.claim_idx_reads
    fetches = after.idx_tup_fetch - before.idx_tup_fetch - watch.own.heap_fetches
    done, total = [], 0
    for bin_index, count in curve:
        total += count
        done.append((round((bin_index + 1) * 0.1, 3), total))
    return {
        "kind": "external",
        "mode": watch.sampler.mode(),
        "worker_modes": watch.sampler.modes(),
        "workers": ran,
        "jobs": jobs,
        "seconds": _r(drain_s, 3),
        "jobs_per_s": round(jobs / drain_s) if drain_s else None,
        "due_to_done_s": _r(from_due_s, 3),
        "start_late_p50_ms": _r(late_p50),
        "start_late_p99_ms": _r(late_p99),
        "start_late_max_ms": _r(late_max),
        "idx_reads_per_job": round(max(0, claim_reads) / jobs, 2),
        "heap_fetch_per_job": round(max(0, fetches) / jobs, 2),
        "max_lock_waiters": watch.sampler.max_lock_waiters,
        "dead_tuples_start": before.n_dead_tup,
        "dead_tuples_end": after.n_dead_tup,
        "bucket_owner_share": _r(share, 3),
        "retried_jobs": retried,
        "failed_jobs": watch.failed,
        "queue": opts.queue,
        "job_type": opts.job_type,
        "run_id": ours.run,
        "due_at": due_at,
        "curve": done,
    }


def _delete(conn: psycopg.Connection[Any], ours: Ours) -> int:
    """Delete the run's rows (and their attempt history) in batches, walking up the id range."""
    deleted, low = 0, ours.lo
    while True:
        ids = [
            r[0]
            for r in conn.execute(
                f"""DELETE FROM dispatcher_jobs WHERE id = ANY(ARRAY(
                    SELECT id FROM dispatcher_jobs WHERE {_OURS}
                     ORDER BY id LIMIT %(n)s))
                RETURNING id""",
                ours.params(lo=low, n=DELETE_BATCH),
            ).fetchall()
        ]
        if not ids:
            return deleted
        conn.execute("DELETE FROM dispatcher_job_attempts WHERE job_id = ANY(%s)", (ids,))
        deleted, low = deleted + len(ids), max(ids)


def _plot(result: Result, out_dir: Path, opts: Options) -> None:
    try:
        from bench.plots import curve_plot

        machine_label = (
            f"bench driver: {result.machine['cores']} cores; "
            f"PostgreSQL {result.machine['postgres']}"
        )
        path = curve_plot(
            result.rows,
            out_dir,
            machine_label,
            f"{SCENARIO}_drain_curve.png",
            f"Burst on a live fleet: {opts.jobs} jobs due at one instant",
            label_of=lambda r: f"{r['mode']}, {r['workers']} workers",
        )
        print(f"written: {path}", flush=True)
    except ImportError:
        print("no plot: matplotlib is not installed (pip install '.[bench]')", flush=True)


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _say(message: str, code: int) -> int:
    print(f"bench: {message}", file=sys.stderr, flush=True)
    return code
