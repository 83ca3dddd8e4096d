"""A handler that ignores its timeout, in a real `dispatcher run`: an async one that swallows its
cancellation, a sync one asleep for an hour. The worker logs it, gives up (stops claiming, lets
its other jobs finish), exits with the stuck code within its bound, and the handler dies with the
process; the job's lease, kept until then, brings it back to another worker only once the first
is gone. Never two runs at once, no job lost."""

from __future__ import annotations

import time

import pytest

from dispatcher.serve.lifecycle import EXIT_STUCK
from tests.chaos import journal
from tests.chaos.support import EXIT_ALLOWANCE_S, enqueue, started_by
from tests.helpers import fetchall, overlapping, status_counts, wait_until

pytestmark = pytest.mark.chaos

LEASE_S = 3.0
OPTS = dict(lease_s=LEASE_S, coordinator_lease_s=3, coordinator_poll_s=0.5, retry_base_s=0.05)
# The stuck worker: a 1 s timeout, stuck 1 s later, given up on 1 s after that, a 1 s grace for the
# rest.
STUCK = dict(
    job_timeout_s=1.0,
    stuck_grace_s=1.0,
    stuck_exit_after_s=1.0,
    shutdown_grace_s=1.0,
    concurrency=4,
)
# From the handler's start: timeout + grace + exit_after + the watch's 1 s look, then the shutdown
# bound (grace + 6 s, dispatcher/serve/worker.py), and the tier's allowance for a loaded machine.
EXIT_BOUND_S = 1.0 + 1.0 + 1.0 + 1.0 + (1.0 + 6.0) + EXIT_ALLOWANCE_S
OTHER_JOBS = 20


@pytest.mark.parametrize(
    ("job_type", "worker_opts"),
    [
        ("stuck_first_async", {}),
        ("stuck_first_sync", {"sync_threads": 2}),
    ],
    ids=["async-swallows-cancel", "sync-sleeps-for-ever"],
)
def test_a_worker_with_a_stuck_handler_exits_and_the_job_runs_again_elsewhere_only_after(
    chaos_dsn, workers, job_type, worker_opts
):
    journal.install_journal(chaos_dsn)
    enqueue(chaos_dsn, job_type, 1, max_attempts=5)
    [(job_id,)] = fetchall(chaos_dsn, "SELECT id FROM dispatcher_jobs")
    first = workers.start(chaos_dsn, "a", **STUCK, **worker_opts, **OPTS)
    wait_until(
        lambda: job_id in started_by(workers.executions(), first.pid),
        30,
        lambda: f"a runs the job:\n{first.log_tail()}",
    )
    began = time.monotonic()
    # a still has free slots and claims these while its handler is stuck, then finishes them.
    enqueue(chaos_dsn, "record_slow", OTHER_JOBS, {"s": 0.2})
    second = workers.start(chaos_dsn, "b", **worker_opts, **OPTS)
    second.wait_for_log(r"worker b running", 30)

    code = first.exited_within(EXIT_BOUND_S, began)
    exited_wall = time.time()
    exited_s = time.monotonic() - began
    log = first.log_text()
    assert code == EXIT_STUCK, f"the stuck exit code, not {code}:\n{first.log_tail()}"
    assert f"job {job_id} ({job_type}) is stuck" in log and "giving up on stuck handlers" in log
    assert log.count(" is stuck: ") == 1, "each stuck job is logged once"
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == OTHER_JOBS + 1,
        LEASE_S + 30,
        lambda: f"every job completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"b": 0}, workers.log_tails()

    entries = journal.entries(chaos_dsn)
    assert set(journal.completions(entries).values()) == {1}, "each job completed exactly once"
    claims = [e.new_locked_by for e in entries if e.is_claim and e.job_id == job_id]
    assert claims == ["a", "b"], "given back, or run a third time"
    [reaped] = journal.expired_leases_of(entries, "a")
    assert reaped.job_id == job_id, "it came back by its lease, not by a release"
    # a kept extending the lease until it exited (a lease of 3 s, held for several times that) ...
    assert (
        reaped.old_lease_expires_at is not None
        and reaped.old_lease_expires_at.timestamp() > exited_wall
    )
    # ... so b ran it only once a was gone: no overlap, with a's run cut at its exit.
    executions = workers.executions(include_unfinished=True)
    assert job_id in started_by(executions, second.pid)
    assert not overlapping(executions, cut_at={first.pid: exited_wall}), "the job ran twice at once"
    assert next(run for run in executions[job_id] if run.pid == first.pid).end is None, (
        "a's run died with a"
    )
    print(
        f"\n{job_type}: a exited {exited_s:.1f} s after the handler started "
        f"(bound {EXIT_BOUND_S:g} s)"
    )
