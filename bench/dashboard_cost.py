"""What one refresh of each `dispatcher web` page costs at N jobs:
python -m bench.dashboard_cost [--jobs 1000000] [--dsn DSN] [--out DIR].

Builds a table of N jobs with a production-like mix (mix() below) in a database of its own,
created and dropped on the admin DSN (--dsn, DISPATCHER_BENCH_DSN, else the local server on
5432; a throwaway embedded PostgreSQL where none answers), then calls each page's real read
functions (dispatcher/web/reads.py, dispatcher.admin) on one autocommit connection that never
prepares, as the dashboard's pool does: the wall time of one refresh (median and p95), and for
each statement the refresh sent, EXPLAIN (ANALYZE, BUFFERS) at the top level. Not a scenario of
`python -m bench` (CI runs `bench all --quick`); the JSON goes under --out (default: a temporary
folder), never bench/results. The figures are in docs/design/dashboard.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.core import Result, machine
from coordinator.pg.connect import ConnectionLimits
from coordinator.pg.dsn import describe_dsn
from coordinator.pg.sqlfile import load_all
from dispatcher import admin
from dispatcher.db import migrate, query
from dispatcher.web import chart_reads, reads

QUEUES = ("default", "emails", "reports")
SHARES = {
    "queued": 0.04,
    "scheduled": 0.02,
    "running": 0.002,
    "failed": 0.02,
    "halted": 0.0001,
    "discarded": 0.005,
    "cancelled": 0.005,
    "waiting": 0.003,
}  # of N; the rest completed
# 1/60 of these finished in the last minute
FINISHED = ("completed", "failed", "discarded", "cancelled")
HOUR_S, RECENT_S = 3600, 60
SLOW_MS = 50.0
PAGE_SIZE = 50  # dispatcher/web/views.py: a page lists PAGE_SIZE, asking for one more
_QUEUE = f"(ARRAY{list(QUEUES)})[1 + {{of}} % {len(QUEUES)}]"
_ERROR = "'TimeoutError: upstream did not answer within 30 s'"
# Columns that differ from the defaults in _INSERT, per kind of job: t0 is when it entered its
# status (spread over the hour, or over the last minute for the recent slice), i its index in its
# kind.
KINDS: dict[str, dict[str, str]] = {
    "completed": {
        "status": "'completed'",
        "locked_at": "t0 - interval '2 s'",
        "completed_at": "t0",
        "locked_by": "'worker-' || id % 12",
    },
    "queued": {"status": "'queued'", "attempts": "0"},
    "scheduled": {
        "status": "'queued'",
        "attempts": "0",
        "run_at": "now() + (60 + id % 86400) * interval '1 s'",
    },
    "running": {
        "status": "'running'",
        "updated_at": "now() - (id % 30) * interval '1 s'",
        "locked_at": "now() - (id % 30) * interval '1 s'",
        "locked_by": "'worker-' || id % 12",
        "lease_expires_at": "now() + interval '30 s'",
    },
    "failed": {"status": "'failed'", "attempts": "3", "failed_at": "t0", "last_error": _ERROR},
    "halted": {
        "status": "'failed'",
        "attempts": "3",
        "failed_at": "t0",
        "last_error": _ERROR,
        "ordering_key": "'key-' || i",
        "ordering_halted": "true",
        "queue_name": _QUEUE.format(of="i"),
    },
    "discarded": {
        "status": "'discarded'",
        "attempts": "20",
        "failed_at": "t0",
        "last_error": _ERROR,
    },
    "cancelled": {"status": "'cancelled'", "attempts": "0"},
    "waiting": {
        "status": "'waiting'",
        "attempts": "0",
        "ordering_key": "'key-' || i % {keys}",
        "queue_name": _QUEUE.format(of="(i % {keys})"),
    },
}
DEFAULTS = {
    "queue_name": _QUEUE.format(of="id"),
    "attempts": "1",
    "run_at": "t0",
    "updated_at": "t0",
    "locked_at": "NULL",
    "locked_by": "NULL",
    "lease_expires_at": "NULL",
    "completed_at": "NULL",
    "failed_at": "NULL",
    "last_error": "NULL",
    "ordering_key": "NULL",
    "ordering_halted": "false",
}
_INSERT = """INSERT INTO dispatcher_jobs (id, job_type, payload, bucket, {columns})
OVERRIDING SYSTEM VALUE
SELECT id, (ARRAY['send_email', 'resize_image', 'sync_account', 'build_report'])[1 + id % 4],
       jsonb_build_object('user_id', id, 'locale', 'en'), (id / 3) % 64, {values}
  FROM (SELECT {first} + (k * {step}) % {space} AS id, k - {lo} AS i
          FROM generate_series({lo}::bigint, {hi}) AS k) AS s
 CROSS JOIN LATERAL (SELECT now() - {ago} * interval '1 s'
                            + (id - {first}) * ({span}::float8 / {space}) * interval '1 s'
                            AS t0) AS t"""
_FLEET = f"""
INSERT INTO dispatcher_members (queue, member_id, lock_key, expires_at)
SELECT q, 'worker-' || m, m, now() + interval '30 s'
  FROM unnest(ARRAY{list(QUEUES)}) q, generate_series(0, 3) m;
INSERT INTO dispatcher_leader (queue, leader_id, lock_key, expires_at)
SELECT q, 'worker-0', 0, now() + interval '30 s' FROM unnest(ARRAY{list(QUEUES)}) q;
INSERT INTO dispatcher_bucket_owners (queue, bucket, owner)
SELECT q, b, 'worker-' || b % 4 FROM unnest(ARRAY{list(QUEUES)}) q, generate_series(0, 63) b
    ON CONFLICT (queue, bucket) DO UPDATE SET owner = excluded.owner;
INSERT INTO dispatcher_limits (job_type, queue_name, max_running, per_second, burst_jobs) VALUES
  ('resize_image', '*', 20, NULL, 1), ('send_email', 'emails', NULL, 50, 10),
  ('*', 'reports', 4, NULL, 1);
INSERT INTO dispatcher_paused_queues (queue_name) VALUES ('reports');
INSERT INTO dispatcher_schedules
       (name, queue_name, job_type, cadence, time_zone, catch_up, fingerprint, next_slot_at)
SELECT 'nightly-' || s, 'default', 'build_report', 'every 1h', 'UTC', 'latest', 'f',
       date_trunc('hour', now()) + interval '1 h'
  FROM generate_series(1, 20) s;
INSERT INTO dispatcher_schedule_runs (schedule_name, slot_at, job_id, outcome)
SELECT 'nightly-' || s, date_trunc('hour', now()) - h * interval '1 h', s * 1000 + h, 'completed'
  FROM generate_series(1, 20) s, generate_series(0, 47) h;
INSERT INTO dispatcher_job_attempts
       (job_id, attempt, worker, started_at, finished_at, duration_ms, outcome, error)
SELECT id, a, 'worker-' || a, updated_at - (4 - a) * interval '1 min',
       updated_at - (4 - a) * interval '1 min' + interval '30 s', 30000,
       CASE WHEN a = 3 THEN 'failed' ELSE 'retried' END, last_error
  FROM dispatcher_jobs, generate_series(1, 3) a WHERE status = 'failed';
SELECT setval(pg_get_serial_sequence('dispatcher_jobs', 'id'),
              (SELECT max(id) FROM dispatcher_jobs))"""
# The charts' rows (runtime/queue_stats.py writes them): 7 days of minutes per queue and for all
# queues together (''), what the rollup keeps; and 50 workers' rows of the last 2 minutes, not
# rolled up yet.
_STATS = f"""
INSERT INTO dispatcher_stats_by_minute (minute, queue_name, finished, failed, waits, depth)
SELECT date_trunc('minute', now()) - m * interval '1 min', q, 900 + m % 200, m % 7,
       array_fill(3::bigint, ARRAY[21]), 40000 - m % 1000
  FROM generate_series(0, 7 * 1440 - 1) m, unnest(ARRAY{list(QUEUES)} || ARRAY['']) q;
INSERT INTO dispatcher_stats_by_worker (minute, queue_name, worker_id, finished, failed, waits)
SELECT date_trunc('minute', now()) - m * interval '1 min', q, 'worker-' || w, 20, 1,
       array_fill(1::bigint, ARRAY[21])
  FROM generate_series(0, 1) m, unnest(ARRAY{list(QUEUES)}) q, generate_series(1, 50) w"""


def mix(jobs: int) -> list[tuple[str, bool, int]]:
    """(kind, recent, jobs) that add up to `jobs`: SHARES of each kind (at least 1), the rest
    completed; `recent` rows (1/60 of each finished kind, 15,000 completed at 1M) finished in the
    last minute, the others over the hour before, as at a steady 15,000 completions a minute."""
    counts = {kind: max(1, round(jobs * share)) for kind, share in SHARES.items()}
    counts = {"completed": jobs - sum(counts.values()), **counts}
    if counts["completed"] < RECENT_S:
        raise ValueError(f"too few jobs for the mix: {jobs}")
    rows = []
    for kind, n in counts.items():
        recent = n * RECENT_S // HOUR_S if kind in FINISHED else 0
        rows += [(kind, False, n - recent)] + ([(kind, True, recent)] if recent else [])
    return rows


def insert_statements(
    segments: list[tuple[str, int]], *, first: int, ago_s: int, span_s: int, keys: int
) -> list[str]:
    """INSERT ... SELECT generate_series for each (kind, jobs): ids first.. spread over the kinds by
    a stride coprime with their number (each kind all over the id range, as in a live table),
    t0 growing with the id from now() - ago_s over span_s."""
    space = sum(n for _, n in segments)
    step = next(p for p in (1_000_003, 999_983, 7_919, 101, 7) if space % p)
    statements, lo = [], 0
    for kind, n in segments:
        columns = {**DEFAULTS, **KINDS[kind]}
        statements.append(
            _INSERT.format(
                columns=", ".join(columns),
                values=", ".join(columns.values()).replace("{keys}", str(keys)),
                first=first,
                step=step,
                space=space,
                lo=lo,
                hi=lo + n - 1,
                ago=ago_s,
                span=span_s,
            )
        )
        lo += n
    return statements


def load(conn: psycopg.Connection[Any], jobs: int) -> Callable[[], None]:
    """The jobs older than a minute, the fleet and flow-control rows, VACUUM ANALYZE; returns what
    inserts the last minute's jobs (newest ids), to call just before measuring."""
    segments = mix(jobs)
    keys = next(n for kind, _, n in segments if kind == "halted")
    old = [(k, n) for k, recent, n in segments if not recent]
    new = [(k, n) for k, recent, n in segments if recent]
    began = time.monotonic()
    for statement in insert_statements(
        old, first=1, ago_s=HOUR_S, span_s=HOUR_S - RECENT_S, keys=keys
    ):
        conn.execute(statement)
    conn.execute(_FLEET)
    conn.execute(_STATS)
    conn.execute("VACUUM ANALYZE")
    print(
        f"  loaded {sum(n for _, n in old):,} jobs in {time.monotonic() - began:.0f} s", flush=True
    )

    def recent() -> None:
        for statement in insert_statements(
            new, first=sum(n for _, n in old) + 1, ago_s=RECENT_S, span_s=RECENT_S, keys=keys
        ):
            conn.execute(statement)
        conn.execute("SELECT setval(pg_get_serial_sequence('dispatcher_jobs', 'id'), %s)", (jobs,))

    return recent


class Recorder(psycopg.Cursor[Any]):
    """Keeps each statement sent while `Recorder.sent` is a list: what EXPLAIN then runs again."""

    sent: list[tuple[str, Any]] | None = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if Recorder.sent is not None:
            Recorder.sent.append((query, params))
        return super().execute(query, params, **kwargs)


def statement_names() -> dict[str, str]:
    """Each named query's text as sent (admin's with its filters filled in) -> its name."""
    names = {}
    for name in load_all("dispatcher.db"):
        text = query(name)
        names[text] = name
        names[text.replace("{filters}", "(" + query("admin_filters") + ")")] = name
    return names


def pages(conn: psycopg.Connection[Any], queue: str) -> dict[str, Callable[[], Any]]:
    """One refresh of each page: the calls dispatcher/web/views.py makes, with its arguments."""
    limits, lease = ConnectionLimits(), 10.0

    def jobs(**given: Any) -> Callable[[], Any]:
        return lambda: admin.list_jobs(
            conn, admin.Filters(**given), limit=PAGE_SIZE + 1, limits=limits
        )

    def search(**given: Any) -> Callable[[], Any]:  # a search's page: one window of ids
        return lambda: admin.search_jobs(
            conn, admin.Filters(**given), limit=PAGE_SIZE + 1, limits=limits
        )

    failed_in_queue = {"statuses": ("failed",), "queues": (queue,)}
    page_one = admin.list_jobs(
        conn, admin.Filters(**failed_in_queue), limit=PAGE_SIZE + 1, limits=limits
    )
    job_id = conn.execute("SELECT max(job_id) FROM dispatcher_job_attempts").fetchone()[0]  # type: ignore[index]

    def overview() -> Any:
        return reads.overview(
            conn, limits, mode="partitioned", coordinator="postgres", completed_rows_kept=True
        )

    return {
        "overview": overview,
        "jobs": jobs(),
        "jobs status=failed": jobs(statuses=("failed",)),
        "jobs queue+failed p2": jobs(**failed_in_queue, before_id=page_one[PAGE_SIZE - 1].id),
        # Searches (docs/design/dashboard.md): every payload holds locale=en, one user_id each;
        # failed and discarded jobs hold the error. A miss walks the whole window.
        "search payload hit": search(payload=admin.payload_filter("locale=en")),
        "search payload miss": search(payload=admin.payload_filter("user_id=-5")),
        "search error text": search(error="UPSTREAM did not"),
        "search error miss": search(error="no such text"),
        "search id list": jobs(ids=tuple(range(job_id, 0, -997)[:50])),
        # A bulk change's count is not windowed: by the statuses it applies to, whole table.
        "confirm retry payload": lambda: admin.match_jobs(
            conn, admin.Filters(payload={"user_id": job_id}), "retry", limits=limits
        ),
        "confirm purge payload": lambda: admin.match_jobs(
            conn, admin.Filters(payload={"user_id": job_id}), "purge", limits=limits
        ),
        "job": lambda: admin.show_job(conn, job_id, limits=limits),
        # The charts (the overview's: every queue; a queue's page): the rollup's rows only.
        "charts 1h": lambda: chart_reads.read_series(conn, limits, "1h"),
        "charts 24h": lambda: chart_reads.read_series(conn, limits, "24h"),
        "queue charts 1h": lambda: chart_reads.read_series(conn, limits, "1h", queue),
        "queue charts 24h": lambda: chart_reads.read_series(conn, limits, "24h", queue),
        "workers": lambda: reads.fleet(conn, limits, member_lease_s=lease),
        # The bucket map's page reads the queues to choose from, and the map.
        "bucket map": lambda: (
            reads.queue_names(conn, limits),
            reads.bucket_map(conn, limits, queue, member_lease_s=lease),
        ),
        "flow": lambda: (
            admin.list_limits(conn, limits=limits),
            admin.paused_queues(conn, limits=limits),
            admin.list_halted_keys(
                conn, admin.Filters(halted=True), limit=PAGE_SIZE, limits=limits
            ),
            admin.list_schedules(conn, limits=limits),
        ),
    }


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def explain(conn: psycopg.Connection[Any], sql: str, params: Any, runs: int = 3) -> dict[str, Any]:
    """Median execution ms of `runs` EXPLAIN ANALYZE, the top plan node's shared buffers (hit +
    read)."""
    times, top = [], {}
    for _ in range(runs):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params, prepare=False
        ).fetchone()
        plan = row[0] if row else [{}]
        plan = plan[0] if isinstance(plan, list) else plan
        times.append(float(plan["Execution Time"]))
        top = plan["Plan"]
    return {
        "exec_ms": round(statistics.median(times), 3),
        "buffers": int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
        "rows": int(top.get("Actual Rows", 0)),
    }


def measure(
    conn: psycopg.Connection[Any], name: str, refresh: Callable[[], Any], *, runs: int, warmups: int
) -> dict[str, Any]:
    for _ in range(warmups):
        refresh()
    wall = []
    for _ in range(runs):
        began = time.perf_counter()
        refresh()
        wall.append(1000 * (time.perf_counter() - began))
    Recorder.sent = []
    refresh()
    sent, Recorder.sent = Recorder.sent, None
    names, statements = statement_names(), []
    # Replayed in one transaction, so a SET LOCAL the page sends (web_serial_reads) holds for the
    # statements after it, as it does in the page's own transaction.
    with conn.transaction():
        for sql, params in sent:
            if isinstance(sql, str) and sql.lstrip().upper().startswith("SET "):
                conn.execute(sql, params, prepare=False)
            elif isinstance(sql, str) and sql in names:
                statements.append({"statement": names[sql], **explain(conn, sql, params)})
                if statements[-1]["exec_ms"] > SLOW_MS:
                    statements[-1]["plan"] = "\n".join(
                        r[0]
                        for r in conn.execute(
                            "EXPLAIN (ANALYZE, BUFFERS) " + sql, params, prepare=False
                        ).fetchall()
                    )
    return {
        "page": name,
        "median_ms": round(statistics.median(wall), 2),
        "p95_ms": round(p95(wall), 2),
        "runs": runs,
        "statements": statements,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """A line per page (its refresh's wall time), then one per statement it sent."""
    lines = [
        f"  {'page':<22}{'median ms':>10}{'p95 ms':>9}  "
        f"{'statement':<22}{'exec ms':>9}{'buffers':>9}"
    ]
    for r in rows:
        head = f"  {r['page']:<22}{r['median_ms']:>10.2f}{r['p95_ms']:>9.2f}"
        for i, s in enumerate(
            r["statements"] or [{"statement": "-", "exec_ms": 0.0, "buffers": 0}]
        ):
            lines.append(
                f"{head if i == 0 else ' ' * len(head)}  {s['statement']:<22}{s['exec_ms']:>9.2f}"
                f"{s['buffers']:>9}"
            )
    return "\n".join(lines)


@contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """A migrated database of our own on `admin_dsn`'s server (or on a throwaway embedded one, as
    bench/core.py starts it, when that server does not answer), dropped after."""
    try:
        psycopg.connect(admin_dsn, connect_timeout=3).close()
    except psycopg.OperationalError:
        from dispatcher.devtools.embedded import start_postgres

        print(f"  no server at {describe_dsn(admin_dsn)}: an embedded one", flush=True)
        with start_postgres(durable=True) as server, scratch_database(server.dsn) as dsn:
            yield dsn
        return
    name = f"dispatcher_bench_dashboard_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        dsn = make_conninfo(admin_dsn, dbname=name)
        migrate(dsn)
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dashboard_cost",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "DISPATCHER_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="admin DSN: a database of the bench's own is created and dropped there",
    )
    parser.add_argument(
        "--runs", type=int, default=20, help="timed refreshes per page (after --warmups)"
    )
    parser.add_argument("--warmups", type=int, default=3)
    parser.add_argument(
        "--queue", default=QUEUES[0], help="the bucket map's queue, and the filtered jobs list's"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for dashboard_cost.json (default: a temporary one)",
    )
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="dashboard_cost_"))
    with scratch_database(args.dsn) as dsn:
        result = Result("dashboard_cost", machine=machine(dsn))
        m = result.machine
        m.update(jobs=args.jobs, mix=mix(args.jobs), loadavg_before=os.getloadavg())
        print(
            f"\n== dashboard_cost: {args.jobs:,} jobs; {m['cores']} cores, "
            f"PostgreSQL {m['postgres']}",
            flush=True,
        )
        with psycopg.connect(
            dsn, autocommit=True, prepare_threshold=None, cursor_factory=Recorder
        ) as conn:
            load(conn, args.jobs)()
            for name, refresh in pages(conn, args.queue).items():
                result.rows.append(
                    measure(conn, name, refresh, runs=args.runs, warmups=args.warmups)
                )
                print(f"  {name}: {result.rows[-1]['median_ms']} ms", flush=True)
        # (1, 5, 15 min): others' work on these cores shows here
        m["loadavg_after"] = os.getloadavg()
    print()
    print(table(result.rows))
    for row in result.rows:
        for s in row["statements"]:
            if "plan" in s:
                print(f"\nslow (> {SLOW_MS:g} ms): {row['page']}: {s['statement']}\n{s['plan']}")
    print(f"\nload average before/after: {m['loadavg_before']} / {m['loadavg_after']}")
    print(f"written: {result.save(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
