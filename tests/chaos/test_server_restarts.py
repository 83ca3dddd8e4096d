"""The servers go away mid-drain: PostgreSQL restarted (fast, or immediate: a crash and recovery)
and the Redis coordinator killed and started again. Workers must ride it out: stay up, lose no
job, complete each exactly once, never run a job twice at once, and exit 0 afterwards.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.chaos import journal
from tests.chaos.support import enqueue, ride_out_a_redis_outage
from tests.helpers import overlapping, status_counts, unfinished, wait_until

pytestmark = pytest.mark.chaos

# A 10 s job lease outlasts a restart (about 1 s, a few on a loaded machine), so no lease need
# expire; the coordinator's minimum lease (3 s) lets a worker that lost its backend degrade fast.
OPTS = dict(
    lease_s=10, coordinator_lease_s=3, coordinator_poll_s=0.5, retry_base_s=0.05, shutdown_grace_s=5
)


def assert_drained_exactly_once(dsn, workers, jobs):
    """Every job completed, each exactly once in the database, each run to its end at least
    once by a worker, and no two runs of a job at the same time."""
    assert status_counts(dsn) == {"completed": jobs}
    completions = journal.completions(journal.entries(dsn))
    assert len(completions) == jobs and set(completions.values()) == {1}, completions.most_common(3)
    executions = workers.executions()
    assert len(executions) == jobs and not unfinished(executions)
    assert not overlapping(executions)
    return sum(len(runs) > 1 for runs in executions.values())


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restart_mid_drain(restartable_pg, workers, mode):
    dsn, server = restartable_pg.dsn, restartable_pg.server
    journal.install_journal(dsn)
    jobs = 4000
    # 20 ms jobs, 20 at a time per worker: at most 2,000 jobs/s, so the drain lasts >= 2 s and
    # a restart after 800 completions lands in the middle of it.
    enqueue(dsn, "record_slow", jobs, {"s": 0.02})
    procs = [workers.start(dsn, name, concurrency=20, batch_size=20, **OPTS) for name in ("a", "b")]
    wait_until(
        lambda: status_counts(dsn).get("completed", 0) >= 800,
        60,
        lambda: f"800 jobs completed:\n{workers.log_tails()}",
    )
    server.restart(mode)
    restarted_at = datetime.now(UTC)
    assert status_counts(dsn).get("completed", 0) < jobs, "the drain was over before the restart"

    wait_until(
        lambda: status_counts(dsn).get("completed") == jobs,
        60,
        lambda: (
            f"all {jobs} jobs completed after the restart: {status_counts(dsn)}\n"
            f"{workers.log_tails()}"
        ),
    )
    for worker in procs:  # each saw the server go, and is still up
        worker.wait_for_log("listener lost its connection", 10)
        assert worker.alive(), worker.log_tail()
    assert workers.stop_all() == {"a": 0, "b": 0}, workers.log_tails()

    after = [e for e in journal.entries(dsn) if e.new_status == "completed" and e.at > restarted_at]
    assert after, "no job completed after the restart: it did not happen mid-drain"
    reruns = assert_drained_exactly_once(dsn, workers, jobs)
    print(f"\n{mode} restart: {len(after)} jobs completed after it, {reruns} ran more than once")


def test_redis_killed_and_started_again_mid_drain(chaos_dsn, chaos_redis, workers):
    journal.install_journal(chaos_dsn)
    jobs, later = 4000, 500
    # 50 ms jobs, 10 at a time per worker: at most 400 jobs/s, so the first 4,000 last >= 10 s,
    # longer than the outage (3 s until the workers degrade, then a few hundred jobs without Redis).
    enqueue(chaos_dsn, "record_slow", jobs, {"s": 0.05})
    opts = dict(
        coordinator="redis", redis_url=chaos_redis.url, concurrency=10, batch_size=10, **OPTS
    )
    procs = [workers.start(chaos_dsn, name, **opts) for name in ("r0", "r1")]
    for worker in procs:
        worker.wait_for_log(r"worker r\d running", 30)
    wait_until(lambda: status_counts(chaos_dsn).get("completed", 0) >= 200, 30, "draining")

    ride_out_a_redis_outage(chaos_dsn, procs, chaos_redis, jobs, 200)
    # Back on their assigned buckets, they take new work as before.
    enqueue(chaos_dsn, "record_slow", later, {"s": 0.05})
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == jobs + later,
        60,
        lambda: f"all jobs completed: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    assert all(w.alive() for w in procs), workers.log_tails()
    assert workers.stop_all() == {"r0": 0, "r1": 0}, workers.log_tails()
    reruns = assert_drained_exactly_once(chaos_dsn, workers, jobs + later)
    print(f"\nredis outage: {reruns} jobs ran more than once")
