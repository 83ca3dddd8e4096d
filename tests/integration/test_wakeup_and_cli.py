"""LISTEN/NOTIFY wake-ups, multiple queues, the CLI and the metrics endpoint."""

import asyncio
import subprocess
import sys
import time
import urllib.request

import psycopg
import pytest

from dispatcher import Config, Job, Registry, Worker, enqueue, enqueue_sync
from tests.helpers import (
    ROOT,
    Deadline,
    fetchval,
    free_port,
    run_async,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
    wait_until_async,
)


def test_notify_wakes_an_idle_worker_long_before_its_poll(dsn):
    """Poll interval 30 s: only the notification can explain a pick-up within a second."""
    registry = Registry()
    done: list[float] = []

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        done.append(time.monotonic())

    worker = Worker(
        Config(dsn=dsn, poll_interval_s=30, flush_interval_s=0.01, concurrency=100).replace(),
        registry,
    )

    async def main():
        task = asyncio.create_task(worker.run())
        try:
            await worker.listening.wait()
            await wait_until_async(
                lambda: worker.stats.claims >= 1,
                10,
                "the first (empty) claim of start-up",
                interval_s=0.01,
            )
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                sent = time.monotonic()
                budget = Deadline(5)  # for all three rounds, from the first enqueue
                await enqueue(conn, "ping")
                await wait_until_async(
                    lambda: done, budget, "the first ping handled", interval_s=0.01
                )
                latency = done[0] - sent
                # 20 jobs, one at a time: one claim per notification at most, never one per free
                # slot (concurrency is 100), which would be the stampede.
                claims_before = worker.stats.claims
                for _ in range(20):
                    await enqueue(conn, "ping")
                await wait_until_async(
                    lambda: len(done) >= 21, budget, "21 pings handled", interval_s=0.01
                )
                one_by_one = worker.stats.claims - claims_before
                # 20 jobs committed together: their notifications land at once and are coalesced.
                claims_before = worker.stats.claims
                async with conn.transaction():
                    for _ in range(20):
                        await enqueue(conn, "ping")
                await wait_until_async(
                    lambda: len(done) >= 41, budget, "41 pings handled", interval_s=0.01
                )
                burst = worker.stats.claims - claims_before
        finally:
            worker.stop()
            await task
        return latency, one_by_one, burst

    latency, one_by_one, burst = run_async(main())
    assert latency < 1.0, latency
    assert len(done) == 41
    assert one_by_one <= 20 + 2, f"{one_by_one} claims for 20 notifications"
    assert burst <= 4, f"{burst} claims for one burst of 20 notifications: not coalesced"


def test_a_notification_wakes_only_the_buckets_owner(dsn):
    """Two workers split the buckets (PostgreSQL coordinator). Jobs enqueued one at a time into
    A's buckets must wake A only: B runs no claim at all (its poll timer is 30 s away)."""
    registry = Registry()
    done: list[int] = []

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        done.append(job.bucket)

    def make():
        return Worker(
            Config(
                dsn=dsn,
                poll_interval_s=30,
                flush_interval_s=0.01,
                coordinator_lease_s=3,
                coordinator_poll_s=0.5,
            ).replace(),
            registry,
        )

    a, b = make(), make()

    def split():
        return (
            len(a.assignments["default"].owned() or ()) == 32
            and len(b.assignments["default"].owned() or ()) == 32
            and a.listening.is_set()
            and b.listening.is_set()
        )

    async def main():
        tasks = [asyncio.create_task(w.run()) for w in (a, b)]
        try:
            handled_by = Deadline(15)
            await wait_until_async(split, 10, "two workers to split the buckets")
            # The start-up claims (and first steals) of both have finished, and every wake-up
            # that start-up left (assignment changes, LISTEN's catch-up) has been served: only a
            # NOTIFY for its own buckets (or its 30 s timer) makes either claim now.
            await wait_until_async(
                lambda: split() and a.idle and b.idle,
                10,
                "both workers asleep with no wake-up pending",
            )
            b_claims = b.stats.claims
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                for bucket in a.assignments["default"].owned()[:10]:
                    await enqueue(conn, "ping", bucket=bucket)
                await wait_until_async(
                    lambda: len(done) >= 10, handled_by, "A to handle the 10 pings", interval_s=0.01
                )
            return len(done), b.stats.claims - b_claims
        finally:
            for w in (a, b):
                w.stop()
            await asyncio.gather(*tasks)

    handled, b_claims = run_async(main())
    assert handled == 10
    assert b_claims == 0, (
        f"the other worker ran {b_claims} claims for notifications that were not its own"
    )


def test_idle_steals_back_off_and_a_foreign_notify_brings_them_back(dsn):
    """A worker owning buckets 0-31 (static), idle, polling every 100 ms: steals across the other
    32 buckets back off to one in 9 timer wake-ups instead of one per wake-up. Right after one of
    those steals, a job enqueued into bucket 40 (no owner running) sends a NOTIFY for a foreign
    bucket, which ends the back-off: the job is stolen at the next timer wake-up (<= 120 ms),
    not 8 skipped wake-ups later (>= 640 ms)."""
    registry = Registry()
    done: list[int] = []

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        done.append(job.bucket)

    worker = Worker(
        Config(
            dsn=dsn,
            coordinator="static",
            buckets=tuple(range(32)),
            poll_interval_s=0.1,
            flush_interval_s=0.01,
        ).replace(),
        registry,
    )

    async def main():
        task = asyncio.create_task(worker.run())
        try:
            await worker.listening.wait()
            claims, steal_claims, steals = (
                worker.stats.claims,
                worker.stats.steal_claims,
                worker.stats.steals,
            )

            def idle_counts():  # (claims of our own buckets, steal attempts) since start-up
                return (
                    worker.stats.claims - claims - (worker.stats.steal_claims - steal_claims),
                    worker.stats.steals - steals,
                )

            # 40 idle timer wake-ups (~4 s at 100 ms)
            await wait_until_async(
                lambda: idle_counts()[0] >= 40,
                20,
                lambda: f"40 idle polls (only {idle_counts()[0]} in 20 s)",
                interval_s=0.01,
            )
            idle = idle_counts()
            steals = worker.stats.steals
            # just after a steal: the next is 8 wake-ups away
            await wait_until_async(
                lambda: worker.stats.steals != steals,
                5,
                "a steal by an idle worker (it stopped stealing altogether)",
                interval_s=0.002,
            )
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                sent = time.monotonic()
                await enqueue(conn, "ping", bucket=40)
                await wait_until_async(
                    lambda: done, 5, "the foreign job to be stolen", interval_s=0.005
                )
                stolen_after = time.monotonic() - sent
        finally:
            worker.stop()
            await task
        return idle, stolen_after

    (own_claims, steal_claims), stolen_after = run_async(main())
    assert steal_claims <= own_claims // 4, (
        f"{steal_claims} steals in {own_claims} idle polls: no back-off"
    )
    assert done == [40], "the foreign job was not stolen"
    assert stolen_after < 0.4, (
        f"stolen {stolen_after:.3f} s after its NOTIFY: the back-off did not end"
    )


def test_one_worker_serves_several_queues(dsn):
    registry = Registry()
    seen: dict[str, int] = {}

    @registry.handler("q")
    async def q(job: Job) -> None:
        seen[job.payload["queue"]] = seen.get(job.payload["queue"], 0) + 1

    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue in ("emails", "reports", "ignored"):
            for _ in range(30):
                enqueue_sync(conn, "q", {"queue": queue}, queue=queue)
    worker = Worker(
        Config(
            dsn=dsn, queues=("emails", "reports"), poll_interval_s=0.1, flush_interval_s=0.01
        ).replace(),
        registry,
    )

    async def main():
        task = asyncio.create_task(worker.run())
        try:
            # The 'ignored' jobs were queued before the worker started: had it served that queue,
            # its first claims would have taken them along with the others.
            await wait_until_async(
                lambda: sum(seen.values()) >= 60, 30, "the 60 jobs of the served queues handled"
            )
        finally:
            worker.stop()
            await task

    run_async(main())
    assert seen == {"emails": 30, "reports": 30}
    assert (
        fetchval(
            dsn,
            "SELECT count(*) FROM dispatcher_jobs "
            "WHERE queue_name = 'ignored' AND status = 'queued'",
        )
        == 30
    )


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )


def test_cli_bad_setting_exits_2_and_names_it(dsn):
    import os

    env = {**os.environ, "DISPATCHER_DSN": dsn, "DISPATCHER_MODE": "sideways"}
    result = _cli("status", env=env)
    assert result.returncode == 2
    assert "DISPATCHER_MODE" in result.stderr and "sideways" in result.stderr
    result = _cli("run", "--app", "nope.module:registry", "--dsn", dsn)
    assert result.returncode == 2 and "--app" in result.stderr
    result = _cli(
        "status", env={k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    )
    assert result.returncode == 2 and "DISPATCHER_DSN" in result.stderr
    # Non-finite floats are refused by name, from the environment or from a flag.
    result = _cli("status", env={**os.environ, "DISPATCHER_DSN": dsn, "DISPATCHER_LEASE_S": "inf"})
    assert (
        result.returncode == 2
        and "DISPATCHER_LEASE_S" in result.stderr
        and "finite" in result.stderr
    )
    result = _cli(
        "run", "--app", "tests.apps.recording:registry", "--dsn", dsn, "--flush-interval-s", "nan"
    )
    assert (
        result.returncode == 2
        and "--flush-interval-s" in result.stderr
        and "finite" in result.stderr
    )


def test_the_app_comes_from_dispatcher_app_or_from_app_and_a_bad_one_is_named(dsn):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    result = _cli("run", "--dsn", dsn, env=env)
    assert result.returncode == 2 and "DISPATCHER_APP" in result.stderr and "--app" in result.stderr
    result = _cli("run", "--dsn", dsn, env={**env, "DISPATCHER_APP": "nope.module:registry"})
    assert (
        result.returncode == 2
        and "DISPATCHER_APP" in result.stderr
        and "nope.module" in result.stderr
    )
    result = _cli("run", "--dsn", dsn, env={**env, "DISPATCHER_APP": "no-colon"})
    assert (
        result.returncode == 2
        and "DISPATCHER_APP" in result.stderr
        and "module:attribute" in result.stderr
    )
    result = _cli(
        "run", "--dsn", dsn, "--app", "nope.module:registry", env={**env, "DISPATCHER_APP": "x:y"}
    )
    assert result.returncode == 2 and "--app" in result.stderr and "nope.module" in result.stderr


def test_cli_migrate_enqueue_status(empty_dsn):
    assert _cli("migrate", "--dsn", empty_dsn).returncode == 0
    assert "up to date" in _cli("migrate", "--dsn", empty_dsn).stdout
    out = _cli("enqueue", "hello", "--payload", '{"x": 1}', "--dsn", empty_dsn)
    assert out.returncode == 0 and "enqueued job" in out.stdout
    assert (
        _cli("enqueue", "hello", "--count", "5", "--queue", "other", "--dsn", empty_dsn).returncode
        == 0
    )
    bad = _cli("enqueue", "hello", "--payload", "{not json", "--dsn", empty_dsn)
    assert bad.returncode == 2 and "--payload" in bad.stderr
    big = _cli(
        "enqueue",
        "hello",
        "--payload",
        '{"x": "0123456789"}',
        "--max-payload-bytes",
        "10",
        "--dsn",
        empty_dsn,
    )
    assert (
        big.returncode == 2
        and "--payload" in big.stderr
        and "over the limit of 10 bytes" in big.stderr
    )
    status = _cli("status", "--dsn", empty_dsn)
    assert status.returncode == 0
    assert "default" in status.stdout and "other" in status.stdout
    assert status_counts(empty_dsn) == {"queued": 6}


@pytest.mark.slow
def test_worker_exposes_prometheus_metrics(dsn, tmp_path):
    port = free_port()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(50):
            enqueue_sync(conn, "record")
    worker = start_worker(
        dsn,
        tmp_path,
        log_path=tmp_path / "w.out",
        metrics_port=port,
        poll_interval_s=0.2,
        table_sample_interval_s=0.5,
    )
    try:
        wait_until(lambda: status_counts(dsn).get("completed") == 50, 30, "jobs completed")

        def scrape():
            try:
                return (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
                    .read()
                    .decode()
                )
            except OSError:
                return None

        text = wait_until(
            lambda: (
                (t := scrape())
                and "dispatcher_jobs_completed_total 50.0" in t
                and "dispatcher_db_dead_tuples" in t
                # its group's first assignment waits 1 s for other members to join
                and 'dispatcher_coordinator_owned_buckets{queue="default"} 64.0' in t
                and t
            ),
            10,
            "metrics show 50 completions, a table sample and 64 buckets owned",
        )
        for name in (
            "dispatcher_jobs_claimed_total",
            "dispatcher_claim_seconds_bucket",
            "dispatcher_poll_cycle_seconds_bucket",
            "dispatcher_fenced_writes_total",
            "dispatcher_db_dead_tuples",
            "dispatcher_db_lock_waits",
            "dispatcher_jobs_stolen_total",
            "dispatcher_coordinator_rebalances_total",
            "dispatcher_coordinator_buckets_moved_total",
            "dispatcher_coordinator_rebalance_seconds_bucket",
            "dispatcher_coordinator_heartbeat_age_seconds",
            "dispatcher_coordinator_degraded",
        ):
            assert name in text, name
        # The only worker: it leads, sees itself as the one member and polls all 64 buckets.
        assert "dispatcher_coordinator_members 1.0" in text
        assert "dispatcher_coordinator_is_leader 1.0" in text
        assert 'dispatcher_coordinator_owned_buckets{queue="default"} 64.0' in text
        assert "dispatcher_coordinator_degraded 0.0" in text
    finally:
        assert stop_workers([worker]) == [0]
