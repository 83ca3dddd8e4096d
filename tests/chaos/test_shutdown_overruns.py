"""Handlers that outlive the shutdown grace: a sync one whose thread never returns, an async one
that swallows its cancellation. The process must still end within its bound, and the job must
never run twice at once: it is not given back while its handler runs; its lease brings it back
once the process is gone."""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos import journal
from tests.chaos.support import enqueue, started_by
from tests.helpers import fetchall, overlapping, status_counts, wait_until

pytestmark = pytest.mark.chaos

LEASE_S = 3.0
GRACE_S = 1.0
OPTS = dict(lease_s=LEASE_S, coordinator_lease_s=3, coordinator_poll_s=0.5, retry_base_s=0.05)
# dispatcher/serve/worker.py: everything after the grace within 5 s, the watchdog 1 s later.
EXIT_BOUND_S = GRACE_S + 6.0


@pytest.mark.parametrize(
    ("job_type", "worker_opts"),
    [
        ("never_returns_sync", {"sync_threads": 1}),
        ("swallow_cancel", {}),
    ],
    ids=["sync-thread-never-returns", "async-swallows-cancel"],
)
def test_a_handler_that_outlives_the_grace_never_runs_twice_and_the_process_still_exits(
    chaos_dsn, workers, job_type, worker_opts
):
    journal.install_journal(chaos_dsn)
    enqueue(chaos_dsn, job_type, 1, {"s": 6.0}, max_attempts=5)
    [(job_id,)] = fetchall(chaos_dsn, "SELECT id FROM dispatcher_jobs")
    first = workers.start(chaos_dsn, "a", shutdown_grace_s=GRACE_S, **worker_opts, **OPTS)
    wait_until(
        lambda: job_id in started_by(workers.executions(), first.pid),
        30,
        lambda: f"a runs the job:\n{first.log_tail()}",
    )
    second = workers.start(chaos_dsn, "b", **worker_opts, **OPTS)
    second.wait_for_log(r"worker b running", 30)
    sent = first.signal(signal.SIGTERM)
    code = first.exited_within(EXIT_BOUND_S, sent)
    exited_wall = time.time()
    exited_s = time.monotonic() - sent
    assert code == 1, f"a job left running must show in the exit code:\n{first.log_tail()}"
    assert "still run after the grace period" in first.log_text()
    # Not given back while its handler ran: the job is still `running` under a when a exits ...
    # ... and comes back once its lease runs out; b runs it (the 6 s handler finishes there).
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 1,
        LEASE_S + 30,
        lambda: f"b completes the job: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"b": 0}, workers.log_tails()

    log = journal.entries(chaos_dsn)
    claims = [e for e in log if e.is_claim]
    assert [e.new_locked_by for e in claims] == ["a", "b"], (
        "given back by a before its handler ended"
    )
    assert [e.job_id for e in journal.expired_leases_of(log, "a")] == [job_id], (
        "it came back by its lease"
    )
    executions = workers.executions(include_unfinished=True)
    assert job_id in started_by(executions, second.pid)
    assert not overlapping(executions, cut_at={first.pid: exited_wall}), "the job ran twice at once"
    print(f"\n{job_type}: exited {exited_s:.1f} s after SIGTERM (grace {GRACE_S:g} s)")
