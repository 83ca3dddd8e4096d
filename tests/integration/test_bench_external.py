"""The fleet bench (`python -m bench burst --external-workers`, bench/external.py) against worker
processes started apart from it, as pods would be: it measures them from the database alone,
touches only the rows it enqueued (and deletes them), and refuses to start without a live worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.__main__ import main as bench_main
from bench.fleetview import CLAIM_APPLICATION
from dispatcher import enqueue_sync
from tests.helpers import fetchall, fetchval, start_worker, stop_workers, wait_until

APP = "dispatcher.devtools.demo_app:registry"  # its `noop` handler is the bench's default job type
JOBS = 2_000


def _add_foreign_rows(dsn: str) -> None:
    """Rows the bench did not enqueue: a job of another queue, due in an hour (the workers serve
    that queue too, but it is not due), and an earlier bench run's finished job in the bench
    queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_sync(conn, "noop", {"owner": "the app"}, queue="default", delay_s=3600)
        conn.execute(
            """INSERT INTO dispatcher_jobs
                      (queue_name, job_type, payload, status, bucket, completed_at)
               VALUES ('bench', 'noop', '{"bench_run": "an-earlier-run"}', 'completed', 7, now())"""
        )


def _table(dsn: str) -> list[tuple[Any, ...]]:
    return fetchall(dsn, "SELECT * FROM dispatcher_jobs ORDER BY id")


def _sequence(dsn: str) -> tuple[Any, ...]:
    return fetchall(dsn, "SELECT last_value, is_called FROM dispatcher_jobs_id_seq")[0]


def _connected_workers(dsn: str) -> int:
    return int(
        fetchval(
            dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (CLAIM_APPLICATION,),
        )
    )


def _bench(dsn: str, out: Path, *more: str) -> int:
    return bench_main(
        ["burst", "--external-workers", "--dsn", dsn, "--jobs", str(JOBS), "--out", str(out), *more]
    )


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_fleet_bench_measures_live_workers_and_touches_only_its_own_rows(
    dsn: str, tmp_path: Path, mode: str
) -> None:
    _add_foreign_rows(dsn)
    foreign = _table(dsn)
    workers = [
        start_worker(
            dsn,
            app=APP,
            log_path=tmp_path / f"w{i}.log",
            mode=mode,
            queues="default,bench",
            history="true",
            batch_size=100,
        )
        for i in range(2)
    ]
    try:
        wait_until(lambda: _connected_workers(dsn) == 2, 60, "two worker processes connected")
        code = _bench(dsn, tmp_path / "out")
        assert [w.poll() for w in workers] == [None, None], "the workers outlived the bench"
    finally:
        stop_workers(workers)
    assert code == 0
    result = json.loads((tmp_path / "out" / "burst_external.json").read_text())
    (row,) = result["rows"]
    assert {"cores", "postgres", "python", "database"} <= result["machine"].keys()
    # Every job ran, once; the fleet as the database shows it.
    assert (row["jobs"], row["failed_jobs"], row["retried_jobs"], row["rows_deleted"]) == (
        JOBS,
        0,
        0,
        JOBS,
    )
    assert row["workers_connected"] == 2 and 1 <= row["workers"] <= 2
    assert (row["mode"], row["worker_modes"]) == (mode, {mode: 2})
    assert row["coordinator_members"] == (2 if mode == "partitioned" else 0)
    # The figures are there and sane.
    assert row["seconds"] > 0 and row["jobs_per_s"] > 0
    assert row["due_to_done_s"] >= row["seconds"], "T is at or before the first claim"
    assert 0 <= row["start_late_p50_ms"] <= row["start_late_p99_ms"] <= row["start_late_max_ms"]
    assert row["lead_margin_s"] > 0, "the enqueue committed before the jobs fell due"
    # Each claimed job was read through a claim index and fetched by id at least once (the claim,
    # the completion): with the bench's own reads counted in, or over-subtracted, this would move.
    assert row["idx_reads_per_job"] >= 1 and row["heap_fetch_per_job"] >= 1
    assert row["max_lock_waiters"] >= 0 and row["dead_tuples_end"] >= 0
    assert 0 < row["bucket_owner_share"] <= 1
    assert row["curve"][-1][1] == JOBS
    if _has_matplotlib():
        assert (tmp_path / "out" / "burst_external_drain_curve.png").stat().st_size > 0
    # Only its own rows were touched, and they are gone, their attempt history with them.
    assert _table(dsn) == foreign
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_job_attempts") == 0


def test_fleet_bench_refuses_without_a_live_worker(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _add_foreign_rows(dsn)
    foreign, sequence = _table(dsn), _sequence(dsn)
    assert _connected_workers(dsn) == 0
    assert _bench(dsn, tmp_path / "out") == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "no live worker" in errors[0], errors
    # Nothing enqueued, not even rolled back: the id sequence never moved.
    assert (_table(dsn), _sequence(dsn)) == (foreign, sequence)
    assert not (tmp_path / "out" / "burst_external.json").exists()


def test_fleet_bench_refuses_when_no_worker_serves_its_queue(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers are live but serve `default` only: the probe job is not run, so the bench deletes it
    and refuses before the burst."""
    _add_foreign_rows(dsn)
    foreign = _table(dsn)
    worker = start_worker(dsn, app=APP, log_path=tmp_path / "w.log", queues="default")
    try:
        wait_until(lambda: _connected_workers(dsn) == 1, 60, "the worker connected")
        code = _bench(dsn, tmp_path / "out", "--probe-timeout-s", "2")
    finally:
        stop_workers([worker])
    assert code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "no worker ran a probe job" in errors[0], errors
    assert _table(dsn) == foreign


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401  (only whether it imports)
    except ImportError:
        return False
    return True
