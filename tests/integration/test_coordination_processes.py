"""Real worker processes coordinated by PostgreSQL or Redis: deaths, graceful stops, joins,
churn, a Redis outage, skew. Hand-off figures are printed (run with -s to see them) and
asserted against the issue's targets with the lease set to 3 s."""

import math
import os
import random
import signal
import time

import psycopg
import pytest

from dispatcher import JobSpec, enqueue_many_sync, enqueue_payloads_sync
from tests.coordination import ViewSampler, make_backend
from tests.helpers import (
    Deadline,
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

# The targets hold for any lease from 3 s (the minimum, used by default to keep the suite
# fast) to the default 10 s: COORD_TEST_LEASE_S=10 reruns the hand-off test with the default.
LEASE_S = float(os.environ.get("COORD_TEST_LEASE_S", "3"))


@pytest.fixture(params=["postgres", "redis"])
def coordination(request, tmp_path):
    """(kind, redis_url or None): each Redis test gets a fresh throwaway Redis of its own."""
    if request.param == "postgres":
        yield "postgres", None
        return
    from dispatcher.devtools.embedded import start_redis

    with start_redis() as redis_server:
        yield "redis", redis_server.url


def settings(kind, redis_url, **extra):
    if kind == "postgres_leases_only":  # PgBouncer transaction pooling: no session advisory locks
        kind, extra = "postgres", {"session_locks": "false", **extra}
    base = dict(
        coordinator=kind,
        coordinator_lease_s=LEASE_S,
        coordinator_poll_s=0.5,
        poll_interval_s=0.2,
        flush_interval_s=0.02,
        reaper_interval_s=0.5,
        log_level="INFO",
    )
    if redis_url:
        base["redis_url"] = redis_url
    return {**base, **extra}


def enqueue_spread(dsn, job_type, per_bucket, **payload):
    """Round-robin over the buckets, so FIFO order interleaves them and every claim touches all of
    a worker's buckets (bucket-by-bucket ids would make a new owner reach an inherited bucket only
    when its turn in FIFO order comes, which is right, but hides the hand-off being measured)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many_sync(
            conn,
            [JobSpec(job_type, payload, bucket=b) for _ in range(per_bucket) for b in range(64)],
        )


class Feeder:
    """Adds one short job to every bucket every 100 ms (640 jobs/s, far under what the workers
    can do): every bucket always has fresh due work, and no bucket builds a backlog whose older
    jobs (FIFO) would keep a new owner busy elsewhere. So the first claim that includes a bucket
    shows exactly when its new owner started polling it."""

    def __init__(self, dsn):
        import threading

        self._dsn, self._stop = dsn, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._stop.wait(0.1):
                enqueue_many_sync(
                    conn, [JobSpec("record_slow", {"s": 0.02}, bucket=b) for b in range(64)]
                )

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def buckets_claimed_by(dsn, buckets, member):
    rows = fetchall(
        dsn,
        "SELECT DISTINCT bucket FROM dispatcher_jobs WHERE bucket = ANY(%s) AND locked_by = %s",
        (list(buckets), member),
    )
    return {b for (b,) in rows}


def first_claims_after(dsn, buckets, since, excluding):
    """bucket -> first locked_at after `since` by someone other than `excluding`."""
    rows = fetchall(
        dsn,
        "SELECT bucket, min(locked_at) FROM dispatcher_jobs WHERE bucket = ANY(%s) "
        "AND locked_at > %s AND locked_by <> %s GROUP BY bucket",
        (list(buckets), since, excluding),
    )
    return dict(rows)


def db_now(dsn):
    return fetchval(dsn, "SELECT clock_timestamp()")


@pytest.fixture(params=["postgres", "postgres_leases_only", "redis"])
def any_coordination(request):
    if request.param != "redis":
        yield request.param, None
        return
    from dispatcher.devtools.embedded import start_redis

    with start_redis() as redis_server:
        yield "redis", redis_server.url


def test_kill_stop_and_join_move_buckets_fast(dsn, tmp_path, any_coordination):
    kind, redis_url = any_coordination
    opts = settings(kind, redis_url, concurrency=50, steal="false")
    workers = {
        f"w{i}": start_worker(
            dsn, tmp_path, log_path=tmp_path / f"w{i}.out", worker_id=f"w{i}", **opts
        )
        for i in range(4)
    }
    figures = {}
    with ViewSampler(lambda: make_backend(kind, dsn, redis_url)) as sampler, Feeder(dsn):
        try:
            before = wait_until(
                lambda: sampler.settled({"w0", "w1", "w2", "w3"}), 30, "4 workers settled"
            )

            # SIGKILL: survivors must claim from every victim bucket within lease + 1 s.
            victim = [b for b, m in before.items() if m == "w1"]
            killed_at = db_now(dsn)
            workers["w1"].send_signal(signal.SIGKILL)
            workers.pop("w1").wait()
            firsts = wait_until(
                lambda: (
                    (f := first_claims_after(dsn, victim, killed_at, "w1"))
                    and len(f) == len(victim)
                    and f
                ),
                LEASE_S + 10,
                "survivors claim from all of w1's buckets",
            )
            figures["sigkill_s"] = (max(firsts.values()) - killed_at).total_seconds()

            # SIGTERM: the leaver's buckets move within 1 s.
            mid = wait_until(lambda: sampler.settled({"w0", "w2", "w3"}), 10, "3 workers settled")
            leaver = [b for b, m in mid.items() if m == "w2"]
            stopped_at = db_now(dsn)
            workers["w2"].send_signal(signal.SIGTERM)
            firsts = wait_until(
                lambda: (
                    (f := first_claims_after(dsn, leaver, stopped_at, "w2"))
                    and len(f) == len(leaver)
                    and f
                ),
                10,
                "others claim from all of w2's buckets",
            )
            figures["sigterm_s"] = (max(firsts.values()) - stopped_at).total_seconds()
            assert workers.pop("w2").wait(30) == 0

            # Join: the newcomer polls its share within 1 s of joining; few buckets move.
            two = wait_until(lambda: sampler.settled({"w0", "w3"}), 10, "2 workers settled")
            workers["w4"] = start_worker(
                dsn, tmp_path, log_path=tmp_path / "w4.out", worker_id="w4", **opts
            )
            three = wait_until(lambda: sampler.settled({"w0", "w3", "w4"}), 20, "newcomer settled")
            joined_seen = sampler.first_seen("w4")
            share = [b for b, m in three.items() if m == "w4"]
            polled_at = wait_until(
                lambda: buckets_claimed_by(dsn, share, "w4") == set(share) and time.monotonic(),
                10,
                "newcomer claimed from every bucket of its share",
            )
            figures["join_s"] = polled_at - joined_seen
            figures["join_moved"] = sum(two[b] != three[b] for b in range(64))
        finally:
            stop_workers(list(workers.values()))
    print(f"\n[{kind}] lease {LEASE_S} s: {figures}")
    assert figures["sigkill_s"] <= LEASE_S + 1
    assert figures["sigterm_s"] <= 1.0
    assert figures["join_s"] <= 1.0 + 0.1  # sampler resolution
    assert figures["join_moved"] <= math.ceil(64 / 3)
    owners = sampler.owners_per_epoch()
    assert all(len(v) == 1 for v in owners.values()), {
        k: v for k, v in owners.items() if len(v) > 1
    }


def test_churn_while_50k_jobs_drain(dsn, tmp_path, coordination):
    kind, redis_url = coordination
    # Jobs of 30 ms at concurrency 50: at most ~1,700 jobs/s per worker, so the drain lasts at
    # least 6 s with up to 5 workers, long enough for the 2 s churn schedule to both remove and add
    # a worker during it however fast the machine (no-op jobs drained in under 4 s and the test
    # saw a single event).
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "record_slow", [{"s": 0.03}] * 50_000)
    opts = settings(kind, redis_url, concurrency=50, batch_size=100)
    rng = random.Random(7)
    alive, n = [], 0
    names = {}  # pid -> worker id (its log is <id>.out)
    for _ in range(3):
        alive.append(
            start_worker(dsn, tmp_path, log_path=tmp_path / f"c{n}.out", worker_id=f"c{n}", **opts)
        )
        names[alive[-1].pid] = f"c{n}"
        n += 1
    events, gone = [], []

    # "drained" once every job has completed, else "churn" once the next step is due
    def next_step():
        if status_counts(dsn).get("completed", 0) >= 50_000:
            return "drained"
        return "churn" if time.monotonic() >= next_at else None

    try:
        # The scenario's pacing, not a wait for a condition: a worker joins or leaves every 2 s,
        # on a schedule (the checks in between do not stretch it), until the jobs have drained.
        budget, next_at = Deadline(240), time.monotonic() + 2
        while (
            wait_until(next_step, budget, "50k jobs to drain under churn", interval_s=0.5)
            == "churn"
        ):
            next_at += 2
            # Only a worker that has started may leave: one still importing (seconds on a loaded
            # 2-core machine) has no signal handler yet and dies of SIGTERM's default action.
            started = [
                p for p in alive if "running:" in (tmp_path / f"{names[p.pid]}.out").read_text()
            ]
            if len(alive) > 2 and started and (len(alive) >= 5 or rng.random() < 0.5):
                leaving = started[rng.randrange(len(started))]
                alive.remove(leaving)
                leaving.send_signal(signal.SIGTERM)
                gone.append(leaving)
                events.append("leave")
            else:
                alive.append(
                    start_worker(
                        dsn, tmp_path, log_path=tmp_path / f"c{n}.out", worker_id=f"c{n}", **opts
                    )
                )
                names[alive[-1].pid] = f"c{n}"
                n += 1
                events.append("join")
    finally:
        stop_workers(alive)
        left_codes = [p.wait(30) for p in gone]
    assert left_codes == [0] * len(gone), "a worker that left did not exit cleanly"
    print(f"\n[{kind}] churn events during the drain: {events}")
    assert events.count("leave") >= 1 and events.count("join") >= 1
    executions = read_executions(tmp_path)
    assert len(executions) == 50_000
    assert all(len(runs) == 1 for runs in executions.values()), "a job ran twice"
    assert not overlapping(executions)
    assert status_counts(dsn) == {"completed": 50_000}


def test_skewed_burst_keeps_every_worker_busy(dsn, tmp_path):
    """80% of 10,000 jobs of 10 ms in buckets 0 and 1: without stealing their one or two owners
    do over 8,000 and each other worker at most 2,000 x 16/62 = ~520; with it every one of 4
    workers does a fair part (2,500). The same drain with the jobs spread evenly runs first, for
    the drain-time comparison (printed, not asserted: speed is for benchmarks).

    The jobs arrive only once all 4 workers are up and the assignment has settled: a worker that
    starts first owns all 64 buckets until the others join, and process start-up on 2 busy cores
    varies by a good part of a 2 s drain, which measured start-up order, not stealing."""
    opts = settings("postgres", None, concurrency=20)
    durations, shares = {}, {}
    for shape in ("uniform", "skewed"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE dispatcher_jobs")
        names = {f"{shape}{i}" for i in range(4)}
        with ViewSampler(lambda: make_backend("postgres", dsn, None)) as sampler:
            workers = [
                start_worker(
                    dsn, tmp_path, log_path=tmp_path / f"{name}.out", worker_id=name, **opts
                )
                for name in sorted(names)
            ]
            try:
                wait_until(
                    lambda names=names: sampler.settled(names), 30, f"{shape}: 4 workers settled"
                )
                if shape == "skewed":
                    specs = [JobSpec("record_slow", {"s": 0.01}, bucket=i % 2) for i in range(8000)]
                    specs += [
                        JobSpec("record_slow", {"s": 0.01}, bucket=2 + i % 62) for i in range(2000)
                    ]
                else:
                    specs = [
                        JobSpec("record_slow", {"s": 0.01}, bucket=i % 64) for i in range(10_000)
                    ]
                # one transaction: all 10,000 become visible at once
                with psycopg.connect(dsn) as conn:
                    enqueue_many_sync(conn, specs)
                wait_until(
                    lambda: status_counts(dsn).get("completed") == 10_000,
                    120,
                    f"{shape} jobs drained",
                )
            finally:
                assert stop_workers(workers) == [0, 0, 0, 0]
        durations[shape] = fetchval(
            dsn,
            "SELECT extract(epoch FROM max(completed_at) - min(locked_at))::float8 "
            "FROM dispatcher_jobs",
        )
        shares[shape] = dict(
            fetchall(dsn, "SELECT locked_by, count(*) FROM dispatcher_jobs GROUP BY 1")
        )
    print(
        f"\nskew: drain {durations['skewed']:.2f} s skewed vs {durations['uniform']:.2f} s uniform "
        f"({durations['skewed'] / durations['uniform']:.2f}x); "
        f"jobs per worker when skewed {shares['skewed']}"
    )
    per_worker = shares["skewed"]
    # 1,200 is twice the most a worker owning no hot bucket can do without stealing (~520), and
    # leaves room for the 2 cores being shared unevenly by 4 workers and PostgreSQL.
    assert len(per_worker) == 4 and min(per_worker.values()) >= 1200, per_worker


def test_workers_serving_different_queues_run_every_job_without_stealing(
    dsn, tmp_path, coordination
):
    """Workers serving `qa`, `qb` and `qa,qb`, stealing off: each queue's buckets go only to the
    workers serving that queue, so every job runs through its bucket's owner (none is stranded)."""
    kind, redis_url = coordination
    opts = settings(kind, redis_url, steal="false", concurrency=20)
    names = ("a", "qa"), ("b", "qb"), ("ab", "qa,qb")
    workers = [
        start_worker(
            dsn, tmp_path, log_path=tmp_path / f"{name}.out", worker_id=name, queues=queues, **opts
        )
        for name, queues in names
    ]
    try:
        wait_until(
            lambda: all(
                f"worker {name} running" in (tmp_path / f"{name}.out").read_text()
                for name, _ in names
            ),
            60,
            "the three workers run",
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many_sync(
                conn,
                [
                    JobSpec("record", {}, queue=q, bucket=b)
                    for q in ("qa", "qb")
                    # 512 jobs, 4 in every (queue, bucket)
                    for b in range(64)
                    for _ in range(4)
                ],
            )
        wait_until(
            lambda: status_counts(dsn).get("completed") == 512,
            60,
            lambda: f"every job ran: {status_counts(dsn)}",
        )
    finally:
        assert stop_workers(workers) == [0, 0, 0]
    by_worker = dict(fetchall(dsn, "SELECT locked_by, count(*) FROM dispatcher_jobs GROUP BY 1"))
    wrong = fetchval(
        dsn,
        "SELECT count(*) FROM dispatcher_jobs WHERE (locked_by = 'a' AND queue_name <> 'qa') "
        "OR (locked_by = 'b' AND queue_name <> 'qb')",
    )
    assert wrong == 0, "a worker ran a job of a queue it does not serve"
    assert set(by_worker) <= {"a", "b", "ab"}, by_worker
    executions = read_executions(tmp_path)
    assert len(executions) == 512 and all(len(r) == 1 for r in executions.values())
