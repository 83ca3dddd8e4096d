"""Real worker processes (`dispatcher run`), real signals, a real PostgreSQL."""

import signal
import subprocess
import sys
import time

import psycopg
import pytest

from dispatcher import enqueue_payloads_sync
from dispatcher.devtools.harness import worker_env
from tests.helpers import (
    ROOT,
    fetchall,
    fetchval,
    overlapping,
    read_executions,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
)

pytestmark = pytest.mark.slow

FAST = dict(poll_interval_s=0.2, flush_interval_s=0.02, reaper_interval_s=0.3)


def enqueue(dsn, job_type, n, **payload):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_payloads_sync(conn, job_type, [payload] * n)


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_four_processes_drain_20k_jobs_exactly_once(dsn, tmp_path, mode):
    jobs = 20_000
    enqueue(dsn, "record", jobs)
    workers = [
        start_worker(
            dsn,
            tmp_path,
            log_path=tmp_path / f"w{i}.out",
            mode=mode,
            worker_index=i,
            worker_count=4,
            concurrency=100,
            batch_size=100,
            **FAST,
        )
        for i in range(4)
    ]
    try:
        wait_until(
            lambda: status_counts(dsn).get("completed") == jobs, 120, f"{jobs} jobs completed"
        )
    finally:
        codes = stop_workers(workers)
    assert codes == [0, 0, 0, 0], [(tmp_path / f"w{i}.out").read_text()[-2000:] for i in range(4)]
    executions = read_executions(tmp_path)
    assert len(executions) == jobs, "some job never ran"
    twice = {job: runs for job, runs in executions.items() if len(runs) > 1}
    assert not twice, f"{len(twice)} jobs ran more than once, e.g. {list(twice.items())[:3]}"
    assert not overlapping(executions)
    assert len({run.pid for runs in executions.values() for run in runs}) == 4, (
        "not every worker took part"
    )
    assert status_counts(dsn) == {"completed": jobs}
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE attempts <> 1") == 0


@pytest.mark.parametrize(
    "flag", [[], ["--app", "tests.apps.recording:registry"]], ids=["env", "flag over env"]
)
def test_the_app_is_a_setting_like_the_others(dsn, tmp_path, flag):
    """DISPATCHER_APP names the registry as the ConfigMap of k8s/base does; --app wins over it."""
    enqueue(dsn, "record", 5)
    env = worker_env(
        dsn, app="tests.apps.recording:registry" if not flag else "nope.module:registry", **FAST
    )
    env.update(PYTHONPATH=str(ROOT), RECORD_DIR=str(tmp_path))
    with open(tmp_path / "worker.out", "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dispatcher", "run", *flag],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: status_counts(dsn).get("completed") == 5 or worker.poll() is not None,
            60,
            "the 5 jobs completed",
        )
    finally:
        codes = stop_workers([worker])
    assert codes == [0], (tmp_path / "worker.out").read_text()[-2000:]
    assert status_counts(dsn) == {"completed": 5} and len(read_executions(tmp_path)) == 5


def test_a_killed_workers_jobs_come_back_after_lease_expiry(dsn, tmp_path):
    enqueue(dsn, "record_slow", 40, s=3.0)
    victim = start_worker(
        dsn, tmp_path, log_path=tmp_path / "victim.out", lease_s=2, concurrency=20, **FAST
    )
    wait_until(lambda: status_counts(dsn).get("running") == 20, 30, "victim holds 20 jobs")
    held = {
        row[0] for row in fetchall(dsn, "SELECT id FROM dispatcher_jobs WHERE status = 'running'")
    }
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.monotonic()
    survivor = start_worker(
        dsn, tmp_path, log_path=tmp_path / "survivor.out", lease_s=2, concurrency=40, **FAST
    )
    try:
        wait_until(lambda: status_counts(dsn).get("completed") == 40, 60, "all 40 jobs completed")
        recovered_after = time.monotonic() - killed_at
    finally:
        assert stop_workers([survivor]) == [0]
    rows = fetchall(dsn, "SELECT id, attempts, locked_by FROM dispatcher_jobs")
    retried = {job_id for job_id, attempts, _ in rows if attempts == 2}
    assert retried == held, "exactly the victim's jobs ran a second time"
    executions = read_executions(tmp_path)
    assert all(len(runs) == 1 for runs in executions.values()) and len(executions) == 40
    assert not overlapping(executions)
    assert "lease expired" in (tmp_path / "survivor.out").read_text()
    assert recovered_after < 2 + 3 + 10  # lease + job time + generous slack for start-up


def test_sigterm_gives_back_unstarted_jobs_at_once_and_finishes_running_ones(dsn, tmp_path):
    """One sync thread, ten claimed jobs: one runs, nine wait. SIGTERM must put the nine back to
    queued immediately (attempt not counted) while the running one finishes within the grace."""
    enqueue(dsn, "record_sync", 10, s=2.0)
    worker = start_worker(
        dsn,
        tmp_path,
        log_path=tmp_path / "w.out",
        sync_threads=1,
        concurrency=10,
        shutdown_grace_s=20,
        **FAST,
    )
    wait_until(lambda: status_counts(dsn).get("running") == 10, 30, "worker holds all 10 jobs")
    # The first job went to the single thread when it was claimed; the other nine wait in the
    # backlog.
    worker.send_signal(signal.SIGTERM)
    counts = wait_until(
        lambda: (c := status_counts(dsn)).get("queued") == 9 and c,
        1.5,
        "nine unstarted jobs released within 1.5 s of SIGTERM",
    )
    assert counts.get("running") == 1 and not counts.get("completed"), (
        "released before the running job ended"
    )
    assert worker.wait(timeout=30) == 0
    assert status_counts(dsn) == {"queued": 9, "completed": 1}
    assert fetchval(dsn, "SELECT max(attempts) FROM dispatcher_jobs WHERE status = 'queued'") == 0
    assert len(read_executions(tmp_path)) == 1
