"""A worker whose connection to PostgreSQL stalls: a proxy stops forwarding without closing
anything (no FIN, no RST), as a hung NAT, a partition or a frozen pooler would.

What must hold: the worker notices within about half a lease and says so, stops claiming, gives
up its running jobs before their leases can be taken over (so nothing runs twice at once), comes
back when the path heals, and exits within its bound on SIGTERM whatever the database does.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.chaos import journal
from tests.chaos.support import enqueue, started_by
from tests.helpers import overlapping, status_counts, unfinished, wait_until

pytestmark = pytest.mark.chaos

# heartbeat every 1.33 s; statements get min(5, lease/2) = 2 s before they count as stalled
LEASE_S = 4.0
# A stall shows at the next heartbeat round trip (every interval, +10% jitter) once it has gone
# unanswered for the statement timeout: 3.5 s here; 16 s of the 30 s lease at the defaults.
NOTICE_BOUND_S = LEASE_S / 3 * 1.1 + LEASE_S / 2
OPTS = dict(lease_s=LEASE_S, coordinator_lease_s=3, coordinator_poll_s=0.5, retry_base_s=0.05)
# The worker's own bound after SIGTERM: grace + 5 s, and its watchdog 1 s later
# (dispatcher/serve/worker.py).
EXIT_AFTER_GRACE_S = 6.0


def test_a_stalled_connection_is_noticed_and_its_jobs_given_up_before_anyone_can_rerun_them(
    chaos_dsn, proxy_to, workers
):
    journal.install_journal(chaos_dsn)
    proxy = proxy_to(chaos_dsn)
    stalled = workers.start(
        proxy.dsn_via(chaos_dsn), "s", concurrency=10, shutdown_grace_s=2, **OPTS
    )
    stalled.wait_for_log(r"worker s running", 30)
    enqueue(chaos_dsn, "record_slow", 10, {"s": 8.0})  # longer than the lease: they need heartbeats

    def s_runs_all():
        runs = set(started_by(workers.executions(), stalled.pid))
        return runs if len(runs) == 10 else None

    held = wait_until(s_runs_all, 30, lambda: f"s runs all 10 jobs:\n{stalled.log_tail()}")
    mark = len(stalled.log_text())
    proxy.blackhole()
    holed_at = time.monotonic()
    stalled.wait_for_log(
        r"heartbeat failed \((heartbeat|ping): no answer within", NOTICE_BOUND_S + 10, start=mark
    )
    noticed_s = time.monotonic() - holed_at
    # A healthy worker beside it takes the jobs once their leases run out.
    workers.start(chaos_dsn, "h", concurrency=10, **OPTS)
    stalled.wait_for_log(
        r"lost the lease of \d+ jobs \(it ran out while our heartbeats did not reach",
        LEASE_S * 3,
        start=mark,
    )
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 10,
        60,
        lambda: f"h completes the 10 jobs: {status_counts(chaos_dsn)}\n{workers.log_tails()}",
    )
    # The path heals: the stalled worker says so and works again.
    proxy.forward()
    stalled.wait_for_log(r"answers heartbeats again", 30, start=mark)
    enqueue(chaos_dsn, "record", 200)
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 210, 60, "the new jobs are done"
    )
    assert workers.stop_all() == {"s": 0, "h": 0}, workers.log_tails()
    # The 10 leases its own timer gave up are counted in its stop line (and in
    # dispatcher_leases_lost_total{reason="ran_out"}), not only those a heartbeat found taken over.
    (stop_line,) = [
        line for line in stalled.log_text().splitlines() if "worker s stopped in" in line
    ]
    assert " leases_lost=10 leases_ran_out=10 " in stop_line, stop_line

    # 1 s: log polling, load
    assert noticed_s <= NOTICE_BOUND_S + 1.0, f"stall noticed after {noticed_s:.1f} s"
    log = journal.entries(chaos_dsn)
    assert set(journal.completions(log).values()) == {1} and len(journal.completions(log)) == 210
    assert {job for job, by in journal.completed_by(log).items() if job in held} == held
    assert all(journal.completed_by(log)[job] == "h" for job in held)
    executions = workers.executions(include_unfinished=True)
    assert not unfinished(executions)
    s_runs = started_by(executions, stalled.pid)
    assert all(r.outcome == "cancelled" for job, r in s_runs.items() if job in held), (
        "s gave its stalled jobs up (cancelled them) rather than finishing them beside their "
        "re-runs"
    )
    assert not overlapping(executions), "a job ran twice at once"
    print(f"\nstall noticed after {noticed_s:.2f} s (lease {LEASE_S:g} s)")


def test_sigterm_during_a_stall_exits_within_the_bound_and_the_leases_bring_the_jobs_back(
    chaos_dsn, proxy_to, workers
):
    journal.install_journal(chaos_dsn)
    proxy = proxy_to(chaos_dsn)
    grace_s = 2.0
    stalled = workers.start(
        proxy.dsn_via(chaos_dsn), "s", concurrency=5, shutdown_grace_s=grace_s, **OPTS
    )
    stalled.wait_for_log(r"worker s running", 30)
    enqueue(chaos_dsn, "record_slow", 5, {"s": 2.0})
    wait_until(
        lambda: len(started_by(workers.executions(), stalled.pid)) == 5, 30, "s runs all 5 jobs"
    )
    # s's jobs finish, but their completions cannot be written. Cut before h starts: a start
    # slower than the jobs (a loaded machine) would let s write them first.
    proxy.blackhole()
    healthy = workers.start(chaos_dsn, "h", concurrency=5, **OPTS)  # idle: s holds every job
    healthy.wait_for_log(r"worker h running", 30)
    wait_until(lambda: not stalled.running_handlers(), 10, "s's handlers end")
    sent = stalled.signal(signal.SIGTERM)
    code = stalled.exited_within(grace_s + EXIT_AFTER_GRACE_S, sent)
    exited_s = time.monotonic() - sent
    assert code == 1, f"outcomes left unwritten must show in the exit code:\n{stalled.log_tail()}"
    assert "could not write" in stalled.log_text()
    # Their leases bring the jobs back: h runs them again (at least once, as promised).
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 5,
        LEASE_S + 30,
        lambda: f"h completes the 5 jobs: {status_counts(chaos_dsn)}\n{healthy.log_tail()}",
    )
    assert workers.stop_all() == {"h": 0}
    log = journal.entries(chaos_dsn)
    taken, never = journal.takeovers(log, "s")
    assert not never and len(taken) == 5 and {t.reclaimed_by for t in taken} == {"h"}
    delays = sorted(t.delay_s for t in taken)
    assert delays[-1] <= 1.0, f"taken over {delays} s after the leases ran out"
    assert not overlapping(workers.executions())
    print(
        f"\nSIGTERM during a stall: exited after {exited_s:.1f} s (grace {grace_s:g} s); "
        f"taken over {delays[-1]:.2f} s after the leases ran out"
    )


def test_a_second_signal_during_a_stall_exits_at_once(chaos_dsn, proxy_to, workers):
    proxy = proxy_to(chaos_dsn)
    stalled = workers.start(proxy.dsn_via(chaos_dsn), "s", shutdown_grace_s=60, **OPTS)
    stalled.wait_for_log(r"worker s running", 30)
    enqueue(chaos_dsn, "record_slow", 3, {"s": 120.0})
    wait_until(
        lambda: len(started_by(workers.executions(), stalled.pid)) == 3, 30, "s runs the jobs"
    )
    proxy.blackhole()
    stalled.signal(signal.SIGTERM)
    stalled.wait_for_log(r"received SIGTERM: stopping gracefully", 10)
    second = stalled.signal(signal.SIGINT)
    assert stalled.exited_within(3.0, second) == 1
    exited_s = time.monotonic() - second
    assert "received SIGINT again during shutdown" in stalled.log_text()
    print(f"\nsecond signal during a stall: exited {exited_s:.2f} s after it (grace 60 s)")


@pytest.mark.parametrize("coordinator", ["postgres", "redis"])
def test_a_worker_that_cannot_reach_its_database_gives_its_buckets_up(
    chaos_dsn, chaos_redis, proxy_to, workers, coordinator
):
    """Stealing off, two workers; one's PostgreSQL path stalls while its coordinator (Redis) still
    answers. Its buckets must move to the other within its claims' timeout + a coordinator lease
    + 1 s, so the jobs in them do not wait for the stall to end."""
    proxy = proxy_to(chaos_dsn)
    coord = dict(coordinator=coordinator, steal="false", concurrency=20, **OPTS)
    if coordinator == "redis":
        coord["redis_url"] = chaos_redis.url
    stalled = workers.start(proxy.dsn_via(chaos_dsn), "s", **coord)
    healthy = workers.start(chaos_dsn, "h", **coord)
    for worker in (stalled, healthy):
        worker.wait_for_log(rf"worker {worker.name} running", 30)
    # The group's first assignment waits for it to settle (1 s; both claim with SKIP LOCKED until
    # then): the stall must hit a worker that owns buckets.
    wait_until(
        lambda: any(
            re.search(r"rebalance by \w+ over 2 members", w.log_text()) for w in (stalled, healthy)
        ),
        30,
        lambda: f"the two workers share the buckets\n{workers.log_tails()}",
    )
    enqueue(chaos_dsn, "record", 64)  # one per bucket (the bucket is random: most of them, anyway)
    wait_until(lambda: status_counts(chaos_dsn).get("completed") == 64, 30, "both workers drain")
    proxy.blackhole()
    holed_at = time.monotonic()
    enqueue(chaos_dsn, "record", 640)
    wait_until(
        lambda: status_counts(chaos_dsn).get("completed") == 704,
        60,
        lambda: (
            f"h runs every job while s is stalled: {status_counts(chaos_dsn)}\n"
            f"{workers.log_tails()}"
        ),
    )
    drained_s = time.monotonic() - holed_at
    # Claims time out after min(5, lease/2) = 2 s; a coordinator lease is 3 s here.
    # + 3: load
    assert drained_s <= LEASE_S / 2 + 3 + 1 + 3, f"drained {drained_s:.1f} s after the stall began"
    if coordinator == "redis":
        assert re.search(r"cannot work .*leaving the group", stalled.log_text()), stalled.log_tail()
    proxy.forward()
    if coordinator == "redis":
        stalled.wait_for_log(r"can work again: rejoining the group", 30)
    assert workers.stop_all() == {"s": 0, "h": 0}, workers.log_tails()
    print(
        f"\n{coordinator}: jobs of the stalled worker's buckets all done {drained_s:.1f} s "
        "into the stall"
    )
