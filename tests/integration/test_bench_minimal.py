"""`bench drain`'s minimal table (bench/minimal.py) drains every job, by either completion, from
several processes, reports a row like the ceiling's, and leaves nothing behind."""

from __future__ import annotations

import psycopg
import pytest

from bench.drain import run_minimal
from dispatcher import enqueue_sync
from tests.helpers import fetchval

JOBS = 1_200  # three claims of 500 per drainer at most: the last claim comes back short, then empty


@pytest.mark.parametrize("kind", ["minimal", "minimal_delete"])
def test_a_minimal_drain_completes_every_job_and_drops_its_table(dsn: str, kind: str) -> None:
    row = run_minimal(dsn, kind, workers=2, jobs=JOBS, postmaster=None)
    assert {k: row[k] for k in ("kind", "mode", "workers", "jobs")} == {
        "kind": kind,
        "mode": "-",
        "workers": 2,
        "jobs": JOBS,
    }
    assert row["seconds"] > 0 and row["jobs_per_s"] > 0
    assert row["idx_reads_per_job"] >= 1  # every job was read from the partial index at least once
    assert row["client_cpu_us_per_job"] > 0
    assert fetchval(dsn, "SELECT to_regclass('bench_minimal_jobs') IS NULL") is True


def test_the_minimal_drain_leaves_the_jobs_table_empty(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # a previous run's rows: their vacuum must not land in this drain
        enqueue_sync(conn, "noop", {})
    run_minimal(dsn, "minimal", workers=1, jobs=10, postmaster=None)
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0
