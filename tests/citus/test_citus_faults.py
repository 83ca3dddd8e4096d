"""Faults during a drain on a Citus cluster: a dispatcher worker killed -9, a Citus worker node
restarted, a shard moved to the other node, the jobs table distributed under the workers. What
must hold, as on one node: no job lost, none run by two workers at once (beyond what a kill
forces: the victim's cut runs), none finished twice by live workers, every job completed in the
end, and every worker that was not killed exits cleanly.
"""

from __future__ import annotations

from collections import Counter

import pytest

from dispatcher.db.citus import distribute
from dispatcher.db.migrate import migrate
from dispatcher.devtools.citus_cluster import CitusCluster
from tests.chaos.support import enqueue, ride_out_a_redis_outage
from tests.helpers import fetchall, fetchval, overlapping, status_counts, unfinished, wait_until

pytestmark = pytest.mark.chaos

JOBS = 3000
BUCKET_0_SHARD = """
SELECT shardid, nodeport
  FROM citus_shards
 WHERE shardid = get_shard_id_for_distribution_column('dispatcher_jobs', 0::smallint)
"""
OPTS = dict(
    lease_s=2.0,
    coordinator_lease_s=3,
    coordinator_poll_s=0.5,
    retry_base_s=0.05,
    shutdown_grace_s=5,
    concurrency=20,
    batch_size=20,
)


def _drain_with(citus_dsn, workers, fault, *, mode="partitioned", jitter_s=4.0):
    """Three workers drain JOBS short jobs, due over `jitter_s`; `fault()` runs once 500 have
    completed and returns the pid of a worker it killed, if any. Returns the execution records
    and the killed pid."""
    procs = [workers.start(citus_dsn, f"c{i}", mode=mode, **OPTS) for i in range(3)]
    for worker in procs:
        worker.wait_for_log(r"worker c\d running", 60)
    enqueue(citus_dsn, "record_slow", JOBS, {"s": 0.02}, jitter_s=jitter_s)
    wait_until(
        lambda: status_counts(citus_dsn).get("completed", 0) >= 500,
        90,
        lambda: f"500 jobs completed:\n{workers.log_tails()}",
    )
    killed = fault(procs)
    assert status_counts(citus_dsn).get("completed", 0) < JOBS, "the drain ended before the fault"
    return _finish(citus_dsn, workers, JOBS), killed


def _finish(dsn, workers, jobs):
    """Once all `jobs` completed, stop the workers (each must exit cleanly); their records."""
    wait_until(
        lambda: status_counts(dsn).get("completed") == jobs,
        120,
        lambda: f"all {jobs} completed: {status_counts(dsn)}\n{workers.log_tails()}",
    )
    exits = workers.stop_all()
    assert all(code == 0 for code in exits.values()), workers.log_tails()
    assert status_counts(dsn) == {"completed": jobs}
    return workers.executions()


def _assert_each_job_once(executions, killed_pid=None, killed_at=None, jobs=JOBS):
    assert len(executions) == jobs
    cut = unfinished(executions)
    assert {e.pid for e in cut} <= ({killed_pid} if killed_pid else set()), cut[:5]
    cut_at = {killed_pid: killed_at} if killed_pid else None
    assert not overlapping(executions, cut_at=cut_at)
    # A live worker never ran a job to its end twice: each completion was written once.
    finished = Counter(
        job_id
        for job_id, runs in executions.items()
        for run in runs
        if run.end is not None and run.pid != killed_pid
    )
    assert max(finished.values()) == 1, finished.most_common(3)


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_worker_killed_mid_drain_loses_nothing(citus_dsn, workers, mode):
    killed: dict[str, float] = {}

    def kill(procs):
        victim = procs[1]
        wait_until(lambda: len(victim.running_handlers()) >= 3, 30, "c1 mid-job", interval_s=0.005)
        killed["at"] = victim.kill()
        return victim.pid

    executions, pid = _drain_with(citus_dsn, workers, kill, mode=mode)
    _assert_each_job_once(executions, pid, killed["at"])


def test_a_citus_worker_node_restarted_mid_drain_loses_nothing(
    citus_cluster: CitusCluster, citus_dsn, workers
):
    def restart(procs):
        citus_cluster.workers[0].restart("fast")
        citus_cluster.wait_ready(citus_dsn)

    executions, _ = _drain_with(citus_dsn, workers, restart)
    _assert_each_job_once(executions)


def test_a_shard_moved_to_the_other_node_mid_drain_loses_nothing(
    citus_cluster: CitusCluster, citus_dsn, workers
):
    moved: dict[str, int] = {}

    def move(procs):
        shard, port = fetchall(citus_dsn, BUCKET_0_SHARD)[0]
        target = next(n.port for n in citus_cluster.workers if n.port != port)
        fetchval(
            citus_dsn,
            "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,"
            " shard_transfer_mode => 'block_writes')",
            (shard, port, target),
        )
        moved.update(shard=shard, target=target)

    executions, _ = _drain_with(citus_dsn, workers, move)
    _assert_each_job_once(executions)
    placed = fetchval(
        citus_dsn, "SELECT nodeport FROM citus_shards WHERE shardid = %s", (moved["shard"],)
    )
    assert placed == moved["target"]


def test_the_jobs_table_distributed_mid_drain_loses_nothing(citus_empty_dsn, workers):
    """`migrate --citus` on a table that holds jobs while workers drain it (the coordinator
    node's own table until then): their writes wait while the rows are copied, then each worker
    finds the table distributed and goes on bucket by bucket."""
    dsn = citus_empty_dsn
    migrate(dsn)

    def distribute_now(procs):
        assert any("distributed by bucket" in step for step in distribute(dsn))

    # Due over 30 s, not 4: distributing places the archive of completed jobs too (64 shards of
    # each of its tables), and the drain must still be going when it is done.
    executions, _ = _drain_with(dsn, workers, distribute_now, jitter_s=30.0)
    _assert_each_job_once(executions)
    shards = fetchval(
        dsn, "SELECT count(*) FROM citus_shards WHERE table_name = 'dispatcher_jobs'::regclass"
    )
    assert shards == 64


def test_the_coordinator_lost_mid_drain_degrades_to_skip_locked_and_loses_nothing(
    citus_dsn, chaos_redis, workers
):
    """Redis, the workers' coordinator here, killed mid-drain: they fall back to SKIP LOCKED
    claims over all 64 buckets (one router query each) and keep draining; it comes back, they
    return to their buckets. None lost, none run by two workers at once."""
    jobs = 4000
    # 50 ms jobs, 10 at a time per worker: at most 600 jobs/s, so the drain outlasts the 3 s
    # until the workers degrade.
    enqueue(citus_dsn, "record_slow", jobs, {"s": 0.05})
    opts = {**OPTS, "concurrency": 10, "batch_size": 10}
    procs = [
        workers.start(citus_dsn, f"r{i}", coordinator="redis", redis_url=chaos_redis.url, **opts)
        for i in range(3)
    ]
    for worker in procs:
        worker.wait_for_log(r"worker r\d running", 60)
    wait_until(lambda: status_counts(citus_dsn).get("completed", 0) >= 300, 60, "draining")
    ride_out_a_redis_outage(citus_dsn, procs, chaos_redis, jobs, 300)
    _assert_each_job_once(_finish(citus_dsn, workers, jobs), jobs=jobs)
