"""Dependencies under faults: a fan-out of 2,000 children and a fan-in, drained by three worker
processes while one is killed -9 mid-fan-out and PostgreSQL restarts, in both modes.

What must hold, from the recording of every run: every job completed; no child started before its
parent's run had ended well, and the sink not before every child's had; no job ran twice at once
(a run the kill cut short is re-run only after its lease ran out); no edge is left, so none of the
graph was stranded.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from dispatcher import Workflow, enqueue_workflow_sync
from tests.helpers import Execution, fetchval, overlapping, status_counts, wait_until

pytestmark = pytest.mark.chaos

CHILDREN = 2000
# 10 s job leases outlast the restart (as test_server_restarts.py); the coordinator's minimum lease.
OPTS = dict(
    lease_s=10.0,
    coordinator_lease_s=3,
    coordinator_poll_s=0.5,
    retry_base_s=0.05,
    shutdown_grace_s=5,
)


def first_success(runs: list[Execution]) -> float:
    """When the job's first run that ended well ended: its completion was written after it."""
    ends = [run.end for run in runs if run.outcome == "ok" and run.end is not None]
    assert ends, f"job {runs[0].job_id} never ended well: {runs}"
    return min(ends)


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_fan_out_and_fan_in_survive_a_kill_9_and_a_postgres_restart(
    restartable_pg, workers, mode
):
    dsn, server = restartable_pg.dsn, restartable_pg.server
    wf = Workflow()
    wf.add("root", "record_slow", {"s": 0.2})
    children = [
        wf.add(f"c{n}", "record_slow", {"s": 0.01}, after=["root"]) for n in range(CHILDREN)
    ]
    wf.add("sink", "record_slow", {"s": 0.01}, after=children)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = enqueue_workflow_sync(conn, wf)
    total = CHILDREN + 2
    procs = [workers.start(dsn, f"w{i}", concurrency=20, mode=mode, **OPTS) for i in range(3)]
    victim = procs[1]
    wait_until(
        lambda: len(victim.running_handlers()) >= 3,
        60,
        lambda: f"w1 mid-fan-out:\n{victim.log_tail()}",
        interval_s=0.005,
    )
    killed_at = victim.kill()
    wait_until(
        lambda: status_counts(dsn).get("completed", 0) >= 600,
        60,
        lambda: f"600 jobs completed: {status_counts(dsn)}\n{workers.log_tails()}",
    )
    server.restart("immediate")
    assert status_counts(dsn).get("completed", 0) < total, "the graph was done before the restart"
    wait_until(
        lambda: status_counts(dsn).get("completed") == total,
        120,
        lambda: f"all {total} jobs completed: {status_counts(dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"w0": 0, "w2": 0}, workers.log_tails()
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_job_deps") == 0, "an edge was stranded"

    executions = workers.executions()
    assert not overlapping(executions, cut_at={victim.pid: killed_at})
    root_done = first_success(executions[ids["root"]])
    child_done = []
    for name in children:
        runs = executions[ids[name]]
        assert min(run.start for run in runs) >= root_done, f"{name} started before the root ended"
        child_done.append(first_success(runs))
    sink_start = min(run.start for run in executions[ids["sink"]])
    assert sink_start >= max(child_done), "the sink started before its last parent ended"
    print(
        f"\n{mode}: sink started {1000 * (sink_start - max(child_done)):.1f} ms after the last "
        f"child ended; killed at {time.strftime('%X', time.localtime(killed_at))}"
    )
