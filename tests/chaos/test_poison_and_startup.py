"""Poison jobs and start-up errors, with real `dispatcher run` processes.

- A handler raising SystemExit or KeyboardInterrupt fails its job; the worker lives on. One
  that kills its process (os._exit, as an OOM kill would) is slowed by the retry policy's
  backoff on each lease expiry and ends `failed` after max_attempts: no crash loop.
- Errors at start that waiting cannot fix (no schema, an older schema, a refused login, a bad
  setting) end the process at once with one clear line; an unreachable server and, with
  --wait-for-schema, a schema not yet migrated are waited out.
"""

from __future__ import annotations

import psycopg
import pytest

from dispatcher import enqueue_payloads_sync
from dispatcher.db.migrate import migrate
from tests.chaos.support import FAST, enqueue
from tests.helpers import (
    RETRY_LOG,
    fetchall,
    fetchval,
    overlapping,
    read_executions,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
)

pytestmark = pytest.mark.chaos

OPTS = dict(lease_s=3, coordinator_lease_s=3, coordinator_poll_s=0.5, retry_base_s=0.05)
# a fatal start-up error ends the process within this (interpreter start included)
START_BOUND_S = 20.0


@pytest.mark.parametrize("job_type", ["raise_system_exit", "raise_keyboard_interrupt"])
def test_a_handler_raising_systemexit_or_keyboardinterrupt_fails_its_job_and_the_worker_lives(
    chaos_dsn, workers, job_type
):
    enqueue(chaos_dsn, job_type, 3, max_attempts=2)
    worker = workers.start(chaos_dsn, "w", **OPTS)
    wait_until(
        lambda: status_counts(chaos_dsn) == {"failed": 3},
        30,
        lambda: f"the poison jobs end failed: {status_counts(chaos_dsn)}\n{worker.log_tail()}",
    )
    rows = fetchall(chaos_dsn, "SELECT attempts, last_error FROM dispatcher_jobs")
    exception = {
        "raise_system_exit": "SystemExit: 3",
        "raise_keyboard_interrupt": "KeyboardInterrupt",
    }[job_type]
    assert all(attempts == 2 and exception in error for attempts, error in rows), rows
    enqueue(chaos_dsn, "record", 50)  # and the worker still works
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 50, 30, "the next jobs complete"
    )
    assert worker.alive()
    assert workers.stop_all() == {"w": 0}, worker.log_tail()
    runs = workers.executions()
    assert sum(len(r) for r in runs.values()) == 3 * 2 + 50


def test_a_job_that_kills_its_worker_backs_off_then_fails_for_good(chaos_dsn, tmp_path):
    """A handler calls os._exit(1). Two workers, restarted when they die (as Kubernetes would).
    With max_attempts=3 the job kills exactly 3 workers, each retry scheduled in the future by the
    retry policy, then stays `failed` with the reason; the other jobs complete meanwhile."""
    with psycopg.connect(chaos_dsn, autocommit=True) as conn:
        conn.execute(RETRY_LOG)
        enqueue_payloads_sync(conn, "exit_process", [{}], max_attempts=3)
    enqueue(chaos_dsn, "record", 200)
    settings = dict(lease_s=1, coordinator_lease_s=3, retry_base_s=1.0, **FAST)
    started = 0

    def spawn():
        nonlocal started
        started += 1
        return start_worker(chaos_dsn, tmp_path, log_path=tmp_path / f"w{started}.out", **settings)

    workers = [spawn(), spawn()]
    deaths = []

    def poison_failed():  # meanwhile, a worker that died is restarted
        if (
            fetchval(
                chaos_dsn, "SELECT status FROM dispatcher_jobs WHERE job_type = 'exit_process'"
            )
            == "failed"
        ):
            return True
        for i, proc in enumerate(workers):
            if proc.poll() is not None:
                deaths.append(proc.returncode)
                workers[i] = spawn()
        return False

    try:
        wait_until(
            poison_failed,
            90,
            lambda: f"the poison job to fail for good (after {len(deaths)} deaths)",
        )
        # A while longer: a failed job must not be claimed again (no 4th death).
        wait_until(
            lambda: status_counts(chaos_dsn).get("completed") == 200,
            60,
            "the other 200 jobs completed",
        )
        for proc in workers:
            assert proc.poll() is None, "a worker died after the poison job had failed for good"
    finally:
        codes = stop_workers(workers)
    assert deaths == [1, 1, 1]
    assert codes == [0, 0]
    status, attempts, expiries, error = fetchall(
        chaos_dsn,
        "SELECT status, attempts, lease_expiries, last_error FROM dispatcher_jobs "
        "WHERE job_type = 'exit_process'",
    )[0]
    assert (status, attempts, expiries) == ("failed", 3, 3)
    assert error.startswith("lease expired 3 times: its worker died or stalled"), error
    retries = fetchall(
        chaos_dsn,
        "SELECT attempts, extract(epoch FROM run_at - written_at)::float8 FROM retry_log "
        "WHERE job_id = (SELECT id FROM dispatcher_jobs WHERE job_type = 'exit_process')",
    )
    assert sorted(a for a, _ in retries) == [1, 2], retries
    assert all(0 < delay <= 1.0 * 2 ** (a - 1) + 0.01 for a, delay in retries), retries
    executions = read_executions(tmp_path)
    poison_id = fetchval(
        chaos_dsn, "SELECT id FROM dispatcher_jobs WHERE job_type = 'exit_process'"
    )
    assert len(executions.pop(poison_id)) == 3
    # Jobs a dying worker had finished but not yet flushed ran again after its lease: at least
    # once, never two at a time.
    assert len(executions) == 200 and not overlapping(executions)


def fatal_start(workers, dsn: str, **settings) -> str:
    """Start a worker that must refuse to run; returns its output after checking it exited 1."""
    worker = workers.start(dsn, "w", **settings)
    code = worker.wait_exit(START_BOUND_S)
    text = worker.log_text()
    assert code == 1, text
    assert "Traceback" not in text, text
    return text


def test_no_schema_exits_at_once_naming_the_command(chaos_empty_dsn, workers):
    text = fatal_start(workers, chaos_empty_dsn, **OPTS)
    assert "no dispatcher schema in" in text and "run `dispatcher migrate` first" in text


def test_an_older_schema_exits_at_once(chaos_dsn, workers):
    with psycopg.connect(chaos_dsn, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM dispatcher_schema_version WHERE version = "
            "(SELECT max(version) FROM dispatcher_schema_version)"
        )
    text = fatal_start(workers, chaos_dsn, **OPTS)
    assert "schema is older than this worker" in text and "dispatcher migrate" in text


def test_a_refused_login_exits_at_once_in_one_line_without_the_password(chaos_dsn, workers):
    bad = psycopg.conninfo.make_conninfo(chaos_dsn, user="no_such_role", password="s3cret")
    text = fatal_start(workers, bad, **OPTS)
    [line] = [line for line in text.splitlines() if "cannot log in" in line]
    assert 'role "no_such_role" does not exist' in line
    assert "s3cret" not in text


def test_a_non_finite_setting_is_refused_at_start(chaos_dsn, workers):
    worker = workers.start(chaos_dsn, "w", **{**OPTS, "lease_s": "inf"})
    assert worker.wait_exit(START_BOUND_S) == 2
    assert "DISPATCHER_LEASE_S: must be a finite number" in worker.log_text()


def test_an_unreachable_server_is_waited_for_then_joined(chaos_dsn, proxy_to, workers):
    proxy = proxy_to(chaos_dsn)
    proxy.blackhole()  # accepts, never answers: as a server behind a partition
    worker = workers.start(proxy.dsn_via(chaos_dsn), "w", connect_timeout_s=1, **OPTS)
    first = worker.wait_for_log(r"unreachable at start", 30)
    # a line per try, still waiting
    worker.wait_for_log(r"unreachable at start", 30, start=first.end())
    assert worker.alive()
    proxy.forward()
    worker.wait_for_log(r"worker w running", 30)
    enqueue(chaos_dsn, "record", 20)
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 20,
        30,
        "it works once the server answers",
    )
    assert workers.stop_all() == {"w": 0}


def test_wait_for_schema_waits_for_the_migration_then_runs(chaos_empty_dsn, workers):
    worker = workers.start(chaos_empty_dsn, "w", wait_for_schema=True, **OPTS)
    worker.wait_for_log(r"waiting for `dispatcher migrate` \(--wait-for-schema\)", 30)
    assert worker.alive()
    migrate(chaos_empty_dsn)
    worker.wait_for_log(r"worker w running", 30)
    enqueue(chaos_empty_dsn, "record", 20)
    wait_until(
        lambda: status_counts(chaos_empty_dsn).get("completed") == 20, 30, "it works once migrated"
    )
    assert workers.stop_all() == {"w": 0}
