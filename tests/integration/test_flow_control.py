"""Flow control against a real PostgreSQL: limits per job type and queue (max running, starts per
second), paused queues, and the version check that makes a change hold from its commit on.

Outcomes asserted: no instant with more jobs of a limited type running than its max_running (counted
by the handlers themselves and by the database), no window with more starts than the rate and its
burst allow, other types never held back by a limited one, no claim of a paused queue.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import psycopg
import pytest

from dispatcher import Config, Job, Registry, Worker, enqueue_payloads_sync, enqueue_sync
from dispatcher.admin import (
    AdminInputError,
    clear_limits,
    list_limits,
    pause_queue,
    paused_queues,
    resume_queue,
    set_limit,
)
from dispatcher.db.claims import claim_sql
from dispatcher.db.rows import Chain, Gate, TypeFilter
from dispatcher.db.store import JobStore
from dispatcher.observe import metrics
from tests.helpers import fetchall, fetchval, plan_nodes, run_async, status_counts, wait_until_async


def config(dsn, **overrides):
    base = dict(dsn=dsn, poll_interval_s=0.2, flush_interval_s=0.01, reaper_interval_s=0.2)
    return Config(**{**base, **overrides}).replace()


def enqueue(dsn, job_type, n, **options):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_payloads_sync(conn, job_type, [{"n": i} for i in range(n)], **options)


class Concurrency:
    """How many handlers of a type run at once in this process, and the most ever seen."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def run(self, seconds: float) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now -= 1


# -- the API ---------------------------------------------------------------------------------------


def test_limits_are_set_replaced_listed_and_cleared(dsn):
    row = set_limit(dsn, "sms", max_running=10)
    assert (row.job_type, row.queue, row.max_running, row.per_second, row.running) == (
        "sms",
        "*",
        10,
        None,
        0,
    )
    row = set_limit(dsn, "sms", per_second=50)  # replaces both values
    assert (row.max_running, row.per_second, row.burst_jobs) == (None, 50.0, 50.0)
    set_limit(dsn, "sms", queue="eu", max_running=3, per_second=0.5)
    set_limit(dsn, "*", queue="bulk", max_running=1)
    assert [(r.job_type, r.queue) for r in list_limits(dsn)] == [
        ("*", "bulk"),
        ("sms", "*"),
        ("sms", "eu"),
    ]
    assert fetchval(dsn, "SELECT burst_jobs FROM dispatcher_limits WHERE queue_name = 'eu'") == 1.0
    assert clear_limits(dsn, "sms", queue="eu") == [("sms", "eu")]
    assert clear_limits(dsn, "nothing") == []
    assert clear_limits(dsn) == [("*", "bulk"), ("sms", "*")]
    assert list_limits(dsn) == []


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        (dict(job_type="sms"), "max_running"),
        (dict(job_type="", max_running=1), "job_type"),
        (dict(job_type="sms", queue="", max_running=1), "queue"),
        (dict(job_type="no such type!", max_running=1), "job_type"),
        (dict(job_type="sms", queue="no such queue!", max_running=1), "queue"),
        (dict(job_type="sms", queue="x" * 101, max_running=1), "queue"),
        (dict(job_type="sms", max_running=-1), "max_running"),
        (dict(job_type="sms", max_running=1.5), "max_running"),
        (dict(job_type="sms", max_running=True), "max_running"),
        (dict(job_type="sms", per_second=0), "per_second"),
        (dict(job_type="sms", per_second=float("nan")), "per_second"),
        (dict(job_type="sms", per_second=float("inf")), "per_second"),
        (dict(job_type="sms", max_running=1, burst_jobs=5), "burst_jobs"),
        (dict(job_type="sms", per_second=1, burst_jobs=0.5), "burst_jobs"),
    ],
)
def test_a_bad_limit_is_refused_naming_the_option_and_nothing_changes(dsn, kwargs, option):
    version = fetchval(dsn, "SELECT version FROM dispatcher_flow_control")
    job_type = kwargs.pop("job_type")
    with pytest.raises(AdminInputError) as refused:
        set_limit(dsn, job_type, **kwargs)
    assert refused.value.option == option
    assert list_limits(dsn) == []
    assert fetchval(dsn, "SELECT version FROM dispatcher_flow_control") == version


@pytest.mark.parametrize("queue", ["no such queue!", "", "*", "mail\n", None])
def test_pause_and_resume_refuse_a_queue_name_no_job_can_have(dsn, queue):
    for change in (pause_queue, resume_queue):
        with pytest.raises(AdminInputError) as refused:
            change(dsn, queue)
        assert refused.value.option == "queue"
    assert paused_queues(dsn) == []


def test_pause_and_resume_say_whether_they_changed_anything(dsn):
    assert pause_queue(dsn, "mail") is True
    assert pause_queue(dsn, "mail") is False
    assert [p.queue for p in paused_queues(dsn)] == ["mail"]
    assert resume_queue(dsn, "mail") is True
    assert resume_queue(dsn, "mail") is False
    assert paused_queues(dsn) == []


# -- the store: the gate and the version -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_concurrent_gated_claims_never_run_more_than_max_running(dsn, mode):
    """Eight claimers at once, each asking for 20: together they hold exactly max_running jobs;
    once some end, the next claims take only what was freed."""
    enqueue(dsn, "sms", 400)
    enqueue(dsn, "other", 50)
    set_limit(dsn, "sms", max_running=7)
    gate = Gate(TypeFilter(("sms",), True), (("sms", "*"),))

    async def scenario():
        stores = [JobStore(dsn, f"w{i}") for i in range(8)]
        version = (await stores[0].flow_state()).version
        try:

            def buckets(i):
                return None if mode == "skip_locked" else tuple(range(i, 64, 8))

            results = await asyncio.gather(
                *(
                    s.jobs_claim("default", 20, 30.0, buckets(i), gate=gate, flow_version=version)
                    for i, s in enumerate(stores)
                )
            )
            held = [job for r in results for job in r.jobs]
            assert len(held) == 7 and {j.job_type for j in held} == {"sms"}
            assert sum(r.held_by == "max_running" for r in results) >= 1
            # Three of them end; the claims that follow share exactly those three slots.
            done = held[:3]
            assert (
                await stores[0].jobs_complete([j.id for j in done], [j.token for j in done])
            ).completed == 3
            again = await asyncio.gather(
                *(
                    s.jobs_claim("default", 20, 30.0, buckets(i), gate=gate, flow_version=version)
                    for i, s in enumerate(stores)
                )
            )
            assert sum(len(r.jobs) for r in again) == 3
        finally:
            for s in stores:
                await s.close()

    run_async(scenario())
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status = 'running'") == 7


def test_a_rate_limit_starts_at_most_its_burst_then_its_rate(dsn):
    """per_second=20 (burst 20): claims in a tight loop for ~2 s start at most 20 + 20 x elapsed,
    by the database's own claim times."""
    enqueue(dsn, "tick", 500)
    set_limit(dsn, "tick", per_second=20)
    gate = Gate(TypeFilter(("tick",), True), (("tick", "*"),))

    async def scenario():
        store = JobStore(dsn, "w")
        version = (await store.flow_state()).version
        started = time.monotonic()
        waits = []
        try:
            while time.monotonic() - started < 2.0:
                result = await store.jobs_claim(
                    "default", 100, 30.0, None, gate=gate, flow_version=version
                )
                if result.held_by == "per_second":
                    assert result.wait_s is not None and 0 < result.wait_s <= 1 / 20 + 1e-6
                    waits.append(result.wait_s)
                    await asyncio.sleep(result.wait_s)
        finally:
            await store.close()
        return waits

    assert run_async(scenario())
    times = [
        t
        for (t,) in fetchall(
            dsn,
            "SELECT extract(epoch FROM locked_at)::float8 FROM dispatcher_jobs "
            "WHERE status = 'running' ORDER BY locked_at",
        )
    ]
    assert len(times) >= 20
    for i, t in enumerate(times):  # every window [t, t + w] from each start
        for j in range(i, len(times)):
            assert j - i + 1 <= 20 + 20 * (times[j] - t) + 1, (i, j, times[j] - t)


def test_a_claim_with_an_old_copy_of_the_tables_claims_nothing(dsn):
    enqueue(dsn, "a", 10)

    async def scenario():
        store = JobStore(dsn, "w")
        try:
            old = (await store.flow_state()).version
            pause_queue(dsn, "elsewhere")  # any change moves the version
            stale = await store.jobs_claim("default", 10, 30.0, None, flow_version=old)
            assert stale.stale and stale.jobs == []
            fresh = await store.jobs_claim(
                "default", 10, 30.0, None, flow_version=(await store.flow_state()).version
            )
            assert not fresh.stale and len(fresh.jobs) == 10
        finally:
            await store.close()

    run_async(scenario())


# -- the fleet -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_three_workers_never_run_more_than_max_running_and_other_types_go_on(dsn, mode):
    registry = Registry()
    slow = Concurrency()
    fast_done: list[float] = []

    @registry.handler("slow")
    async def run_slow(job: Job) -> None:
        await slow.run(0.15)

    @registry.handler("fast")
    async def run_fast(job: Job) -> None:
        fast_done.append(time.monotonic())

    set_limit(dsn, "slow", max_running=3)
    enqueue(dsn, "slow", 30)
    enqueue(dsn, "fast", 600)
    db_most = 0

    async def fleet():
        nonlocal db_most
        workers = [
            Worker(config(dsn, mode=mode, worker_id=f"w{i}", concurrency=10), registry)
            for i in range(3)
        ]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        try:

            async def drained():
                nonlocal db_most
                running = await asyncio.to_thread(
                    fetchval,
                    dsn,
                    "SELECT count(*) FROM dispatcher_jobs "
                    "WHERE status = 'running' AND job_type = 'slow'",
                )
                db_most = max(db_most, running)
                return status_counts(dsn) == {"completed": 630}

            await wait_until_async(drained, 90, "630 jobs completed", interval_s=0.02)
        finally:
            for w in workers:
                w.stop(grace_s=5)
            await asyncio.gather(*tasks)

    run_async(fleet())
    assert slow.most == 3, f"at most 3 and the limit was reached, not {slow.most}"
    assert db_most <= 3
    slow_last = fetchval(dsn, "SELECT max(updated_at) FROM dispatcher_jobs WHERE job_type = 'slow'")
    fast_last = fetchval(dsn, "SELECT max(updated_at) FROM dispatcher_jobs WHERE job_type = 'fast'")
    assert fast_last < slow_last, "the fast jobs waited behind the limited ones"


def test_a_limit_set_while_jobs_run_holds_within_a_second(dsn):
    registry = Registry()
    seen = Concurrency()
    done: list[int] = []

    @registry.handler("x")
    async def x(job: Job) -> None:
        await seen.run(0.05)
        done.append(job.id)

    enqueue(dsn, "x", 3000)
    worker = Worker(config(dsn, concurrency=20), registry)

    async def scenario():
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(lambda: seen.most >= 10, 30, "20 slots in use")
            set_limit(dsn, "x", max_running=2)
            set_at = time.monotonic()
            await wait_until_async(lambda: seen.now <= 2, 5, "at most 2 running")
            settled = time.monotonic() - set_at
            seen.most, before = 0, len(done)
            # 40 jobs more under the limit (about a second at 2 x 50 ms): never more than 2 at once.
            await wait_until_async(
                lambda: len(done) >= before + 40, 30, "40 more jobs done under the limit"
            )
            assert seen.most <= 2, seen.most
            return settled
        finally:
            worker.stop(grace_s=5)
            await task

    assert run_async(scenario()) < 1.5


def test_a_paused_queue_claims_nothing_lets_running_jobs_finish_and_resumes(dsn):
    registry = Registry()
    ran: list[int] = []

    @registry.handler("a")
    async def a(job: Job) -> None:
        if job.payload.get("slow"):
            await asyncio.sleep(0.5)
        ran.append(job.id)

    worker = Worker(config(dsn, concurrency=10, queues=("default", "other")), registry)
    with psycopg.connect(dsn, autocommit=True) as conn:
        slow_id = enqueue_sync(conn, "a", {"slow": True})

    async def scenario():
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(
                lambda: (
                    fetchval(dsn, "SELECT status FROM dispatcher_jobs WHERE id = %s", (slow_id,))
                    == "running"
                ),
                30,
                "the slow job runs",
            )
            pause_queue(dsn, "default")
            paused_at = fetchval(dsn, "SELECT paused_at FROM dispatcher_paused_queues")
            assert enqueue(dsn, "a", 50) == 50  # enqueueing goes on while paused
            await wait_until_async(lambda: slow_id in ran, 10, "the running job finished")
            await wait_until_async(
                lambda: worker.vitals.paused_queues == ("default",), 5, "readyz detail"
            )
            assert metrics.QUEUE_PAUSED.labels("default")._value.get() == 1
            # The worker goes on claiming its other queue meanwhile: once 20 jobs of it are done, it
            # has claimed again and again, and never from the paused one.
            assert enqueue(dsn, "a", 20, queue="other") == 20
            await wait_until_async(lambda: len(ran) == 21, 30, "the other queue's jobs done")
            assert (
                fetchval(
                    dsn,
                    "SELECT count(*) FROM dispatcher_jobs WHERE queue_name = 'default' "
                    "AND locked_at >= %s",
                    (paused_at,),
                )
                == 0
            )
            assert slow_id in ran
            resume_queue(dsn, "default")
            await wait_until_async(
                lambda: status_counts(dsn) == {"completed": 71}, 30, "all done after resume"
            )
        finally:
            worker.stop(grace_s=5)
            await task

    run_async(scenario())
    assert worker.vitals.paused_queues == ()


@pytest.mark.parametrize("control", [None, "limit", "pause"])
def test_a_keyed_completion_never_claims_the_next_job_of_a_paused_queue_or_a_limited_type(
    dsn, control
):
    """A keyed completion claims its key's next job for the completing worker (chaining), except in
    a paused queue or under a limit: then the next job is queued, for a gated claim to take."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "k", [{}] * 2, ordering_keys=["key"] * 2)
    if control == "limit":
        set_limit(dsn, "k", max_running=5)
    elif control == "pause":
        pause_queue(dsn, "default")

    async def scenario():
        store = JobStore(dsn, "w")
        try:
            # no version: as a test may
            (first,) = (await store.jobs_claim("default", 10, 30.0, None)).jobs
            chain = Chain(("default",) * 64, tuple(range(64)), 10, 30.0)
            return await store.jobs_complete([first.id], [first.token], keyed=True, chain=chain)
        finally:
            await store.close()

    done = run_async(scenario())
    assert done.completed == 1
    assert len(done.claimed) == (1 if control is None else 0)
    assert fetchval(dsn, "SELECT status FROM dispatcher_jobs ORDER BY id DESC LIMIT 1") == (
        "running" if control is None else "queued"
    )


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("buckets", [None, tuple(range(0, 64, 4)), tuple(range(64))])
def test_a_type_filtered_claim_still_walks_the_claim_index(dsn, include, buckets):
    """The plain claim that keeps off limited types, and the gated claim that takes only them: the
    same index walk as the unfiltered claim (no sort, no scan of the table), reading past the other
    type's rows only."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dispatcher_jobs (job_type, bucket) SELECT CASE WHEN g % 10 = 0 THEN 'sms' "
            "ELSE 'x' END, g % 64 FROM generate_series(1, 50000) g"
        )
        conn.execute("ANALYZE dispatcher_jobs")
        sql = claim_sql(buckets, TypeFilter(("sms",), include))
        with conn.transaction(force_rollback=True):
            params = {
                "queue": "default",
                "limit": 100,
                "lease_s": 30.0,
                "worker": "w",
                "token": None,
                "flow_version": 0,
                "claim_types": ["sms"],
            }
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0][
                "Plan"
            ]
    nodes = list(plan_nodes(plan))
    assert not [
        n
        for n in nodes
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") != "dispatcher_flow_control"
    ]
    assert not [n for n in nodes if n["Node Type"] == "Sort"]
    assert plan["Actual Rows"] == 100


def test_the_cli_sets_lists_clears_pauses_and_resumes_and_refuses_bad_input(dsn):
    from tests.integration.test_cli_errors import cli, one_line_error

    def ok(*args, code=0):
        result = cli(*args, "--dsn", dsn)
        assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
        return result.stdout

    assert "limit set: job type 'sms' in every queue" in ok(
        "limits", "set", "sms", "--max-running", "10"
    )
    ok("limits", "set", "partner", "--queue", "eu", "--per-second", "2.5", "--burst", "5")
    listed = orjson.loads(ok("limits", "list", "--json"))
    assert [
        (r["job_type"], r["queue"], r["max_running"], r["per_second"], r["burst_jobs"])
        for r in listed
    ] == [("partner", "eu", None, 2.5, 5.0), ("sms", "*", 10, None, 1.0)]
    one_line_error(
        cli("limits", "set", "sms", "--max-running", "-1", "--dsn", dsn), 2, "--max-running"
    )
    one_line_error(cli("limits", "set", "sms", "--dsn", dsn), 2, "--max-running")
    assert fetchval(dsn, "SELECT max_running FROM dispatcher_limits WHERE job_type = 'sms'") == 10
    assert "cleared 1 limits: sms in (every queue)" in ok("limits", "clear", "sms")
    ok("limits", "clear", "sms", code=1)  # nothing to clear
    one_line_error(cli("limits", "clear", "--dsn", dsn), 2, "JOB_TYPE", "--all")  # nothing named
    ok("limits", "clear", "--all")
    assert ok("limits", "list") == "no limits\n"
    assert ok("queues", "pause", "mail") == "queue 'mail' paused\n"
    ok("queues", "pause", "mail", code=1)
    assert ok("queues", "list").startswith("mail ")
    ok("queues", "resume", "mail")
    ok("queues", "resume", "mail", code=1)
    assert ok("queues", "list") == "no paused queues\n"


def test_a_limit_holds_a_claim_back_only_while_jobs_wait_beyond_it(dsn):
    """A worker retries a held-back gated claim soon (and counts it in the metric): only when the
    limit cut the claim short of jobs that were there, never for a limited type with no backlog."""
    enqueue(dsn, "sms", 3)
    set_limit(dsn, "sms", max_running=5)
    gate = Gate(TypeFilter(("sms",), True), (("sms", "*"),))

    async def scenario():
        store = JobStore(dsn, "w")
        try:
            version = (await store.flow_state()).version
            first = await store.jobs_claim(
                "default", 20, 30.0, None, gate=gate, flow_version=version
            )
            # ran out of jobs
            assert (len(first.jobs), first.allowed, first.held_by) == (3, 5, None)
            enqueue(dsn, "sms", 10)
            store.note_ready(None)  # as the enqueue's NOTIFY tells a worker (Citus: a dry bucket)
            second = await store.jobs_claim(
                "default", 20, 30.0, None, gate=gate, flow_version=version
            )
            assert (len(second.jobs), second.allowed, second.held_by) == (
                2,
                2,
                "max_running",
            )
            third = await store.jobs_claim(
                "default", 20, 30.0, None, gate=gate, flow_version=version
            )
            assert (len(third.jobs), third.allowed, third.held_by) == (0, 0, "max_running")
        finally:
            await store.close()

    run_async(scenario())


def test_a_gated_claim_that_rolls_back_counts_no_queue_wait(dsn):
    """A gated claim's jobs count in dispatcher_job_queue_wait_seconds once its transaction
    commits: one that fails after its claim statement (here its token spend, refused by a
    trigger) leaves its jobs queued, to be claimed, and counted, once."""
    from dispatcher.errors import StoreError
    from dispatcher.observe.job_metrics import JOB_STATS

    queue = "gated_waits"
    enqueue(dsn, "tick", 4, queue=queue)
    set_limit(dsn, "tick", queue=queue, per_second=100)
    gate = Gate(TypeFilter(("tick",), True), (("tick", queue),))

    def waits_counted():
        return sum(sum(counts) for q, counts, _ in JOB_STATS.wait_snapshot() if q == queue)

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse_spend() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RAISE EXCEPTION 'no spending today'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_spend BEFORE UPDATE ON dispatcher_limits "
            "FOR EACH ROW EXECUTE FUNCTION refuse_spend()"
        )

    async def claim():
        store = JobStore(dsn, "w")
        try:
            version = (await store.flow_state()).version
            return await store.jobs_claim(queue, 10, 30.0, None, gate=gate, flow_version=version)
        finally:
            await store.close()

    before = waits_counted()
    with pytest.raises(StoreError):
        run_async(claim())
    assert waits_counted() == before and status_counts(dsn) == {"queued": 4}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TRIGGER refuse_spend ON dispatcher_limits")
    assert len(run_async(claim()).jobs) == 4
    assert waits_counted() == before + 4
