"""Flow-control limits under a worker kill: a fleet-wide max_running holds while a worker that held
limited jobs is killed -9, and the dead worker's slots come back with its leases.

What must hold, from the recording of every run: at no instant did more jobs of the limited type run
than its max_running (the killed worker's runs count until it was killed: nothing of them runs
after), every job completed, and the jobs the kill cut short ran again elsewhere.
"""

from __future__ import annotations

import pytest

from dispatcher.admin import set_limit
from tests.chaos.support import enqueue
from tests.helpers import fetchall, most_at_once, status_counts, unfinished, wait_until

pytestmark = pytest.mark.chaos

LEASE_S = 2.0
OPTS = dict(
    lease_s=LEASE_S,
    coordinator_lease_s=3,
    coordinator_poll_s=0.5,
    retry_base_s=0.05,
    shutdown_grace_s=5,
)
MAX_RUNNING = 3


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_max_running_holds_across_a_kill_9_and_the_dead_workers_slots_come_back(
    chaos_dsn, workers, mode
):
    set_limit(chaos_dsn, "record_slow", max_running=MAX_RUNNING)
    slow = enqueue(chaos_dsn, "record_slow", 18, {"s": 0.4})
    fast = enqueue(chaos_dsn, "record", 300)
    procs = [workers.start(chaos_dsn, f"f{i}", concurrency=10, mode=mode, **OPTS) for i in range(3)]
    slow_ids = {
        job_id
        for (job_id,) in fetchall(
            chaos_dsn, "SELECT id FROM dispatcher_jobs WHERE job_type = 'record_slow'"
        )
    }

    def victim_runs_a_limited_job():
        for proc in procs:
            if {e.job_id for e in proc.running_handlers()} & slow_ids:
                return proc
        return None

    victim = wait_until(
        victim_runs_a_limited_job,
        30,
        lambda: f"a worker runs a limited job:\n{workers.log_tails()}",
        interval_s=0.005,
    )
    killed_at = victim.kill()
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == slow + fast,
        90,
        lambda: (
            f"all {slow + fast} jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}"
        ),
    )
    survivors = {p.name for p in procs if p is not victim}
    assert workers.stop_all() == dict.fromkeys(survivors, 0), workers.log_tails()

    executions = workers.executions()
    cut = unfinished(executions)
    assert {e.pid for e in cut} == {victim.pid} and {e.job_id for e in cut} & slow_ids, cut
    assert most_at_once(executions, slow_ids, cut_at={victim.pid: killed_at}) == MAX_RUNNING
    # Each limited job the kill cut short ran again, to its end, in another worker.
    for run in cut:
        assert any(e.pid != victim.pid and e.end is not None for e in executions[run.job_id]), run
