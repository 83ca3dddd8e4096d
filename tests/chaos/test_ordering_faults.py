"""Ordering keys under every fault of issue 24: a worker killed or paused mid-job, buckets handed
off while a key's job runs, PostgreSQL restarted, the coordinator gone, both claim modes at once.

What must hold, checked from the recording of every run (tests/chaos/support.assert_keys_in_order):
every keyed job completed, and for every key, job n+1 started only after every run of job n had
ended, so two jobs of a key never ran at once and a key's jobs ran in enqueue order. A job's own
runs may overlap each other only where a fault forces it (a paused owner's run against its re-run).
"""

from __future__ import annotations

import re

import pytest

from tests.chaos import journal
from tests.chaos.support import assert_keys_in_order, enqueue_keyed, keys_run_by, started_by
from tests.helpers import overlapping, status_counts, unfinished, wait_until

pytestmark = pytest.mark.chaos

LEASE_S = 2.0
# As test_kill_and_pause.py: 2 s job leases, the coordinator's minimum lease (3 s), a first retry
# of at most 50 ms, so a reaped job is due again at once.
OPTS = dict(
    lease_s=LEASE_S,
    coordinator_lease_s=3,
    coordinator_poll_s=0.5,
    retry_base_s=0.05,
    shutdown_grace_s=5,
)


def all_completed(dsn: str, jobs: int) -> bool:
    return status_counts(dsn).get("completed") == jobs


def test_kill_9_mid_job_the_key_waits_for_the_lease_and_the_same_job_runs_again_first(
    chaos_dsn, workers
):
    journal.install_journal(chaos_dsn)
    procs = [workers.start(chaos_dsn, f"k{i}", concurrency=10, **OPTS) for i in range(3)]
    victim = procs[1]
    for worker in procs:
        worker.wait_for_log(r"worker k\d running", 30)
    # 30 keys of 8 jobs each, 0.1-0.4 s: each key takes ~2 s alone, so the kill lands mid-drain.
    jobs = enqueue_keyed(chaos_dsn, 30, 8, (0.1, 0.4))
    wait_until(
        lambda: len(victim.running_handlers()) >= 2,
        30,
        lambda: f"k1 mid-job:\n{victim.log_tail()}",
        interval_s=0.005,
    )
    killed_at = victim.kill()
    wait_until(
        lambda: all_completed(chaos_dsn, jobs),
        60,
        lambda: f"all {jobs} jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"k0": 0, "k2": 0}, workers.log_tails()

    executions = workers.executions()
    cut = unfinished(executions)
    assert cut and {e.pid for e in cut} == {victim.pid}, cut[:5]
    assert_keys_in_order(chaos_dsn, executions, cut_at={victim.pid: killed_at})
    assert not overlapping(executions, cut_at={victim.pid: killed_at})
    # Each job the kill cut short was reaped once its lease ran out and claimed again by another
    # worker: that re-run, and not the key's next job, is what the key ran next.
    taken, never = journal.takeovers(journal.entries(chaos_dsn), "k1")
    assert not never and {t.job_id for t in taken} >= {e.job_id for e in cut}, (never, cut)
    assert all(t.reclaimed_by != "k1" for t in taken)


def test_sigstop_past_the_lease_the_next_job_waits_for_the_rerun(chaos_dsn, workers):
    journal.install_journal(chaos_dsn)
    # 5 keys: each key's first job runs 5 s (p is paused in it), the 3 after it 0.05-0.2 s. 5 s
    # outlasts the spread of q's re-runs: q takes over the heads in p's buckets only once p's
    # coordinator lease (3 s) has run out, up to ~2 s after the job leases.
    heads = enqueue_keyed(chaos_dsn, 5, 1, 5.0)
    jobs = heads + enqueue_keyed(chaos_dsn, 5, 3, (0.05, 0.2), first_seq=1)
    paused = workers.start(chaos_dsn, "p", concurrency=10, **OPTS)

    def p_runs_the_heads():
        runs = set(started_by(workers.executions(), paused.pid))
        return runs if len(runs) == heads else None

    held = wait_until(
        p_runs_the_heads, 30, lambda: f"p runs the {heads} first jobs:\n{paused.log_tail()}"
    )
    paused.pause()
    other = workers.start(chaos_dsn, "q", concurrency=10, **OPTS)
    # Past the lease q reaps the heads and runs them again. p is resumed while those re-runs go
    # on (5 s each), so its stale runs end beside them: the key's next job must wait for both.
    wait_until(
        lambda: set(started_by(workers.executions(), other.pid)) >= held,
        30,
        lambda: f"q re-runs p's jobs:\n{other.log_tail()}",
        interval_s=0.01,
    )
    resumed_at = paused.resume()
    wait_until(
        lambda: all_completed(chaos_dsn, jobs),
        60,
        lambda: f"all {jobs} jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"p": 0, "q": 0}, workers.log_tails()

    executions = workers.executions()
    assert not unfinished(executions)
    p_runs, q_runs = started_by(executions, paused.pid), started_by(executions, other.pid)
    assert all(p_runs[job_id].end > resumed_at for job_id in held), (
        "p's stale runs did not span the pause"
    )
    assert all(q_runs[job_id].end > resumed_at for job_id in held), (
        "q's re-runs ended before p was resumed"
    )
    assert_keys_in_order(chaos_dsn, executions)
    # The only overlaps: p's stalled runs against their own re-runs by q; p's late outcomes fenced.
    pairs = overlapping(executions)
    assert sorted((a.pid, b.pid, a.job_id) for a, b in pairs) == sorted(
        (paused.pid, other.pid, j) for j in held
    )
    assert {
        j: w for j, w in journal.completed_by(journal.entries(chaos_dsn)).items() if j in held
    } == {j: "q" for j in held}


def test_buckets_handed_off_mid_job_the_new_owner_waits_for_the_running_job(chaos_dsn, workers):
    # 24 keys of 10 jobs, 0.3-0.6 s each: ~4.5 s per key. `a` runs alone, `b` joins (buckets
    # move from a to b while a's jobs run), then `a` leaves (SIGTERM: its buckets go to b, its
    # unstarted claims are given back, its running jobs finish).
    first = workers.start(chaos_dsn, "a", concurrency=30, **OPTS)
    first.wait_for_log(r"worker a running", 30)
    jobs = enqueue_keyed(chaos_dsn, 24, 10, (0.3, 0.6))
    wait_until(
        lambda: len(first.running_handlers()) >= 10, 30, lambda: f"a mid-job:\n{first.log_tail()}"
    )
    second = workers.start(chaos_dsn, "b", concurrency=30, **OPTS)
    # The leader (either of them) logs the rebalance that moves buckets to b.
    wait_until(
        lambda: any(
            re.search(r"rebalance by \w+ over 2 members", w.log_text()) for w in (first, second)
        ),
        30,
        lambda: f"a rebalance over both:\n{workers.log_tails()}",
    )
    assert first.running_handlers(), "a had no job running when its buckets moved"
    wait_until(
        lambda: started_by(workers.executions(), second.pid),
        30,
        lambda: f"b runs jobs:\n{second.log_tail()}",
    )
    assert first.stop() == 0, first.log_tail()
    assert status_counts(chaos_dsn).get("completed", 0) < jobs, "the drain was over before a left"
    wait_until(
        lambda: all_completed(chaos_dsn, jobs),
        60,
        lambda: f"all {jobs} jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"b": 0}, workers.log_tails()

    executions = workers.executions()
    assert not unfinished(executions) and not overlapping(executions)
    keys = assert_keys_in_order(chaos_dsn, executions)
    handed = keys_run_by(executions, keys, first.pid) & keys_run_by(executions, keys, second.pid)
    assert handed, "no key had jobs run by both workers: nothing was handed off mid-key"
    print(f"\n{len(handed)} of 24 keys ran on both sides of the hand-off")


def test_postgres_restart_mid_drain_keeps_each_keys_order(restartable_pg, workers):
    dsn, server = restartable_pg.dsn, restartable_pg.server
    # 10 s leases outlast the restart (as test_server_restarts.py); 20 keys of 15 jobs, 20-80 ms.
    opts = {**OPTS, "lease_s": 10}
    jobs = enqueue_keyed(dsn, 20, 15, (0.02, 0.08))
    procs = [workers.start(dsn, name, concurrency=10, **opts) for name in ("a", "b")]
    wait_until(
        lambda: status_counts(dsn).get("completed", 0) >= 60,
        60,
        lambda: f"60 jobs completed:\n{workers.log_tails()}",
    )
    server.restart("immediate")
    assert status_counts(dsn).get("completed", 0) < jobs, "the drain was over before the restart"
    wait_until(
        lambda: all_completed(dsn, jobs),
        90,
        lambda: (
            f"all {jobs} jobs completed after the restart: {status_counts(dsn)}\n"
            f"{workers.log_tails()}"
        ),
    )
    for worker in procs:  # each saw the server go
        worker.wait_for_log("listener lost its connection", 10)
    assert workers.stop_all() == {"a": 0, "b": 0}, workers.log_tails()
    executions = workers.executions()
    assert not unfinished(executions) and not overlapping(executions)
    assert_keys_in_order(dsn, executions)


def test_coordinator_unreachable_degraded_skip_locked_claims_keep_each_keys_order(
    chaos_dsn, chaos_redis, workers
):
    opts = dict(coordinator="redis", redis_url=chaos_redis.url, concurrency=10, **OPTS)
    procs = [workers.start(chaos_dsn, name, **opts) for name in ("r0", "r1")]
    for worker in procs:
        worker.wait_for_log(r"worker r\d running", 30)
    # Each phase's jobs continue the same 12 keys: assigned buckets, degraded SKIP LOCKED over all
    # buckets while Redis is down, assigned buckets again once it is back.
    jobs = enqueue_keyed(chaos_dsn, 12, 6, (0.05, 0.2))
    chaos_redis.kill()
    down = {w.name: w.wait_for_log("falling back to SKIP LOCKED", 3 + 10) for w in procs}
    jobs += enqueue_keyed(chaos_dsn, 12, 6, (0.05, 0.2), first_seq=6)
    wait_until(
        lambda: all_completed(chaos_dsn, jobs),
        60,
        lambda: (
            f"{jobs} jobs completed while Redis is down: {status_counts(chaos_dsn)}\n"
            f"{workers.log_tails()}"
        ),
    )
    chaos_redis.start_again()
    for worker in procs:
        worker.wait_for_log("coordinator backend is back", 20, start=down[worker.name].end())
    jobs += enqueue_keyed(chaos_dsn, 12, 6, (0.05, 0.2), first_seq=12)
    wait_until(
        lambda: all_completed(chaos_dsn, jobs),
        60,
        lambda: f"all {jobs} jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {"r0": 0, "r1": 0}, workers.log_tails()
    executions = workers.executions()
    assert not unfinished(executions) and not overlapping(executions)
    assert_keys_in_order(chaos_dsn, executions)


def test_partitioned_and_skip_locked_workers_side_by_side_keep_each_keys_order(chaos_dsn, workers):
    """As during a rollout that switches the mode: both kinds claim the same keys' jobs at once."""
    procs = [
        workers.start(chaos_dsn, name, mode=mode, concurrency=10, **OPTS)
        for name, mode in (
            ("p0", "partitioned"),
            ("s0", "skip_locked"),
            ("p1", "partitioned"),
            ("s1", "skip_locked"),
        )
    ]
    for worker in procs:
        worker.wait_for_log(rf"worker {worker.name} running", 30)
    jobs = enqueue_keyed(chaos_dsn, 20, 12, (0.01, 0.05))
    wait_until(
        lambda: all_completed(chaos_dsn, jobs),
        60,
        lambda: f"all {jobs} jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert workers.stop_all() == {w.name: 0 for w in procs}, workers.log_tails()
    executions = workers.executions()
    assert not unfinished(executions) and not overlapping(executions)
    keys = assert_keys_in_order(chaos_dsn, executions)
    by_mode = {
        mode: set().union(
            *(keys_run_by(executions, keys, w.pid) for w in procs if w.settings["mode"] == mode)
        )
        for mode in ("partitioned", "skip_locked")
    }
    assert all(by_mode.values()), f"a mode ran no keyed job: {by_mode}"
    print(
        f"\n{len(by_mode['partitioned'] & by_mode['skip_locked'])} of 20 keys ran under both modes"
    )
