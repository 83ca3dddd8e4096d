"""The claim statement and the fences around it, at the store level (no worker runtime)."""

import asyncio
import json

import psycopg
import pytest

from dispatcher import JobSpec, enqueue_many_sync, enqueue_payloads_sync
from dispatcher.db.rows import Steal
from dispatcher.db.store import JobStore, claim_sql, steal_sql
from tests.helpers import (
    analyze_if_stale,
    fetchall,
    fetchval,
    plan_nodes,
    reap_and_claim_again,
    run_async,
    wait_until,
)

ALL = tuple(range(64))


def _fill_by_bulk_enqueue(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 50_000)


def _fill_by_plain_insert_then_worker_maintenance(dsn):
    """Rows that arrived without enqueue_many's ANALYZE: the worker's maintenance must fix stats."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dispatcher_jobs (job_type, bucket) "
            "SELECT 'a', g % 64 FROM generate_series(1, 50000) g"
        )
    analyze_if_stale(dsn)


@pytest.mark.parametrize(
    "fill", [_fill_by_bulk_enqueue, _fill_by_plain_insert_then_worker_maintenance]
)
@pytest.mark.parametrize("mode", ["partitioned", "all_buckets", "skip_locked", "steal", "window"])
def test_claim_plan_on_a_freshly_filled_table_walks_indexes_only(dsn, mode, fill):
    """A known plan trap: right after a table is filled, before autovacuum's ANALYZE, the planner
    must still walk the right partial index and update through the primary key, reading ~n
    index entries for n jobs."""
    fill(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        sql = {
            "partitioned": claim_sql(range(0, 64, 4)),
            "all_buckets": claim_sql(ALL),
            "skip_locked": claim_sql(None),
            "steal": steal_sql(),
            "window": claim_sql((0, 32), window=True),  # its veto finds nothing: one priority
        }[mode]
        with conn.transaction(force_rollback=True):
            params = {
                "queue": "default",
                "limit": 500,
                "lease_s": 30.0,
                "worker": "w",
                "token": None,
                "flow_version": 0,
                "steal_buckets": "{" + ",".join(str(b) for b in range(1, 64, 4)) + "}",
                "steal_reserve": 0,
                "outside": _OUTSIDE,
            }
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
            ).fetchone()[0][0]["Plan"]
    nodes = list(plan_nodes(plan))
    # Only the one-row dispatcher_flow_control (the flow-control version check) may be read whole.
    assert not [
        n
        for n in nodes
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") != "dispatcher_flow_control"
    ], json.dumps(plan)[:2000]
    assert not [n for n in nodes if n["Node Type"] == "Sort"], (
        "claim sorted rows instead of walking an index"
    )
    assert plan["Actual Rows"] == 500
    scanned_indexes = {n.get("Index Name") for n in nodes if "Index" in n["Node Type"]}
    expected = (
        "dispatcher_jobs_claim_bucket_idx"
        if mode in ("partitioned", "steal", "window")
        else "dispatcher_jobs_claim_idx"
    )
    assert scanned_indexes == {expected, "dispatcher_jobs_pkey"}, scanned_indexes
    scanned = sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
        for n in nodes
        if n.get("Index Name", "").startswith("dispatcher_jobs_claim")
    )
    assert scanned <= 500 + 16, f"read {scanned} index entries to claim 500"


_OUTSIDE = "{" + ",".join(str(b) for b in ALL if b not in (0, 32)) + "}"


@pytest.mark.parametrize("vetoed", [False, True])
def test_a_claim_windows_veto_walks_the_bucket_index_once_per_outside_bucket(dsn, vetoed):
    """The veto (claim_window) reads each of the window's other buckets through its own range of
    dispatcher_jobs_claim_bucket_idx, bounded by the priority: never the queue-wide claim index,
    never a sequential scan (one scan with `bucket = ANY(...)` was planned as a sequential scan
    on this table: EXISTS expects a match at once). On one priority it reads no entry; with one
    better job outside the window it stops there, and the claim takes nothing."""
    _fill_by_bulk_enqueue(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if vetoed:
            conn.execute(
                "UPDATE dispatcher_jobs SET priority = -1 "
                "WHERE id = (SELECT min(id) FROM dispatcher_jobs WHERE bucket = 17)"
            )
        params = {
            "queue": "default",
            "limit": 25,
            "lease_s": 30.0,
            "worker": "w",
            "token": None,
            "flow_version": 0,
            "outside": _OUTSIDE,
        }
        sql = claim_sql((0, 32), window=True)
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
            ).fetchone()[0][0]["Plan"]
        with conn.transaction(force_rollback=True):
            rows = conn.execute(sql, params).fetchall()
    (veto,) = [n for n in plan_nodes(plan) if n.get("Subplan Name") == "CTE outranked"]
    scans = [n for n in plan_nodes(veto) if n.get("Relation Name") == "dispatcher_jobs"]
    assert [(n["Node Type"], n["Index Name"]) for n in scans] == [
        (scans[0]["Node Type"], "dispatcher_jobs_claim_bucket_idx")
    ], json.dumps(veto)[:3000]
    assert scans[0]["Node Type"] in ("Index Scan", "Index Only Scan")
    assert "priority <" in scans[0]["Index Cond"], scans[0]["Index Cond"]
    if vetoed:  # bucket 17 is the 17th outside bucket (1-17): one entry read there, then stops
        assert scans[0]["Actual Loops"] == 17
        # rows per loop: 1/17 shown as 0.06 (PostgreSQL 18), or rounded down to 0 before it
        assert round(scans[0]["Actual Rows"] * 17) in (1, 0)
        assert [(r[0], r[9], r[13]) for r in rows] == [(None, 0, True)]
    else:
        assert (scans[0]["Actual Loops"], scans[0]["Actual Rows"]) == (62, 0)
        assert len(rows) == 25 and {r[13] for r in rows} == {False}


def _table_stats(dsn):
    return fetchall(
        dsn,
        """SELECT s.n_live_tup, s.n_tup_upd, s.analyze_count, c.reltuples
                              FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
                             WHERE s.relname = 'dispatcher_jobs'""",
    )[0]


def test_planner_stats_follow_the_tables_growth_not_its_churn(dsn):
    """PlannerStats' ANALYZE runs when rows arrived that the statistics do not know of, not when
    known rows were claimed and completed: a drain is two updates per job and needs no new plan."""

    def insert(n):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dispatcher_jobs (job_type, bucket) "
                "SELECT 'a', g %% 64 FROM generate_series(1, %s) g",
                (n,),
            )

    # this test's own database: no autovacuum racing our ANALYZE
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE dispatcher_jobs SET (autovacuum_enabled = false)")
    insert(20_000)  # a table never analyzed: stale at once
    wait_until(lambda: _table_stats(dsn)[0] == 20_000, 15, "the insert in the table statistics")
    analyze_if_stale(dsn)
    assert _table_stats(dsn)[2:] == (1, 20_000)

    # A drain of those rows: 40k updates, twice the old trigger's 10k modifications; no growth.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs "
            "SET status = 'running', locked_at = now(), lease_expires_at = now()"
        )
        conn.execute("UPDATE dispatcher_jobs SET status = 'completed', completed_at = now()")
    wait_until(lambda: _table_stats(dsn)[1] == 40_000, 15, "the updates in the table statistics")
    analyze_if_stale(dsn)
    assert _table_stats(dsn)[2] == 1, "ANALYZE ran for updates alone"

    insert(30_000)  # 50k rows against statistics of 20k
    wait_until(
        lambda: _table_stats(dsn)[0] == 50_000, 15, "the second insert in the table statistics"
    )
    analyze_if_stale(dsn)
    assert _table_stats(dsn)[2:] == (2, 50_000)


def test_priority_then_fifo_and_delayed_jobs_wait(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        specs = [
            JobSpec("a", {"n": n}, priority=p, bucket=n % 64)
            for n, p in enumerate([5, 0, 5, -1, 0, 5])
        ]
        specs.append(JobSpec("a", {"n": "later"}, priority=-5, delay_s=3600))
        enqueue_many_sync(conn, specs)
        # FIFO within a priority follows run_at then id: stagger run_at in insertion order
        conn.execute(
            "UPDATE dispatcher_jobs SET run_at = run_at - (1000 - id) * interval '1 ms' "
            "WHERE payload->>'n' <> 'later'"
        )

    async def main(buckets):
        store = JobStore(dsn, "w")
        order = []
        while jobs := (await store.jobs_claim("default", 1, 30, buckets)).jobs:
            order.append(jobs[0].payload["n"])
        await store.close()
        return order

    expected = [3, 1, 4, 0, 2, 5]  # -1, then the 0s in order, then the 5s in order; 'later' never
    assert run_async(main(ALL)) == expected
    fetchall(dsn, "SELECT 1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'queued', attempts = 0 WHERE status = 'running'"
        )
    assert run_async(main(None)) == expected


def test_partitioned_claim_takes_only_owned_buckets(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many_sync(conn, [JobSpec("a", bucket=b) for b in range(64) for _ in range(3)])

    async def main():
        store = JobStore(dsn, "w")
        jobs = (await store.jobs_claim("default", 1000, 30, (1, 2, 63))).jobs
        await store.close()
        return jobs

    jobs = run_async(main())
    assert sorted(j.bucket for j in jobs) == [1, 1, 1, 2, 2, 2, 63, 63, 63]
    assert all(j.attempts == 1 for j in jobs)
    rows = fetchall(
        dsn,
        "SELECT locked_by, lease_expires_at > now() + interval '29 s' FROM dispatcher_jobs "
        "WHERE status = 'running'",
    )
    assert rows and all(r == ("w", True) for r in rows)


def test_completion_by_a_stale_owner_is_rejected(dsn):
    """A worker whose lease expired and whose job was taken over cannot complete it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 3)

    async def main():
        old, new = JobStore(dsn, "old"), JobStore(dsn, "new")
        stale, fresh = await reap_and_claim_again(dsn, old, new)
        assert len(stale) == 3
        assert (
            await old.jobs_complete([j.id for j in stale], [j.token for j in stale])
        ).completed == 0
        assert await old.jobs_extend_leases(stale, 30) == {}
        assert await old.jobs_release_owned(stale) == 0
        statuses = fetchall(dsn, "SELECT status, locked_by, attempts FROM dispatcher_jobs")
        assert set(statuses) == {("running", "new", 2)}  # untouched by the stale owner
        assert (
            await new.jobs_complete([j.id for j in fresh], [j.token for j in fresh])
        ).completed == 3
        await old.close()
        await new.close()

    run_async(main())
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status = 'completed'") == 3


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_overlapping_owners_never_claim_the_same_job(dsn, mode):
    """Eight claimers on the SAME buckets at once (a rebalance overlap at its worst)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 6000)
    buckets = ALL if mode == "partitioned" else None

    async def claimer(i):
        store = JobStore(dsn, f"w{i}")
        got = []
        while jobs := (await store.jobs_claim("default", 50, 30, buckets)).jobs:
            got += [j.id for j in jobs]
        await store.close()
        return got

    async def main():
        return await asyncio.gather(*(claimer(i) for i in range(8)))

    claimed = [job_id for part in run_async(main()) for job_id in part]
    assert len(claimed) == 6000
    assert len(set(claimed)) == 6000
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE attempts <> 1") == 0


@pytest.mark.parametrize("taken", [3, 10])
def test_a_claim_counts_the_rows_it_selected_when_others_took_some(dsn, taken):
    """A partitioned selection takes no locks: rows another transaction claims first are skipped
    by our UPDATE. The claim still reports what it selected, so the worker knows its buckets are
    not dry (and one row of NULLs, not nothing, when every selected row was taken)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many_sync(conn, [JobSpec("a", bucket=5) for _ in range(10)])
        first = [
            r[0]
            for r in conn.execute("SELECT id FROM dispatcher_jobs ORDER BY id LIMIT %s", (taken,))
        ]

    async def main():
        store = JobStore(dsn, "w")
        other = await psycopg.AsyncConnection.connect(dsn)
        try:
            # Someone else holds the first rows (a stealer's claim, not yet committed) ...
            await other.execute(
                "UPDATE dispatcher_jobs SET status = 'running', locked_by = 'other' "
                "WHERE id = ANY(%s)",
                (first,),
            )
            claim = asyncio.ensure_future(store.jobs_claim("default", 10, 30, (5, 6)))
            # ... our claim selects all 10 and waits on their row locks ...
            deadline = asyncio.get_running_loop().time() + 10
            while (
                fetchval(
                    dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                )
                == 0
            ):
                assert asyncio.get_running_loop().time() < deadline, (
                    "the claim never waited on the other's rows"
                )
                await asyncio.sleep(0.02)
            await other.commit()  # ... and skips them once the other commits.
            return await asyncio.wait_for(claim, 10)
        finally:
            await other.close()
            await store.close()

    claimed = run_async(main())
    assert (len(claimed.jobs), claimed.selected) == (10 - taken, 10)
    assert not {j.id for j in claimed.jobs} & set(first)
    assert fetchall(
        dsn, "SELECT locked_by, count(*) FROM dispatcher_jobs GROUP BY 1 ORDER BY 1"
    ) == ([("other", taken), ("w", 10 - taken)] if taken < 10 else [("other", 10)])


def _steal_while_another_holds(dsn, held, statement):
    """Ten jobs in bucket 9; another transaction runs `statement` on the ids `held` picks (rows it
    then holds, uncommitted), and a thief steals with a reserve of 4 meanwhile (within 10 s: it
    must not wait on the held rows). Returns (the ids in order, the ids stolen)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many_sync(conn, [JobSpec("a", bucket=9) for _ in range(10)])
        ids = [r[0] for r in conn.execute("SELECT id FROM dispatcher_jobs ORDER BY id")]

    async def main():
        thief = JobStore(dsn, "thief")
        other = await psycopg.AsyncConnection.connect(dsn)
        try:
            await other.execute(statement, (held(ids),))
            return await asyncio.wait_for(
                thief.jobs_claim("default", 100, 30, None, Steal((9,), 4)), 10
            )
        finally:
            await other.rollback()
            await other.close()
            await thief.close()

    return ids, sorted(j.id for j in run_async(main()).jobs)


def test_a_steal_leaves_the_head_to_its_owner_and_never_waits_on_the_owners_claim(dsn):
    """The owner claims the head of its bucket (here: an UPDATE of its first 4 rows, not yet
    committed, as a claim in flight); a thief with a reserve of 4 takes the tail at once, without
    waiting on the owner's row locks, and never a row the owner holds."""
    ids, stolen = _steal_while_another_holds(
        dsn,
        lambda ids: ids[:4],
        "UPDATE dispatcher_jobs SET status = 'running', locked_by = 'owner' WHERE id = ANY(%s)",
    )
    assert stolen == ids[4:]
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status = 'queued'") == 4


def test_two_thieves_of_one_bucket_split_its_tail_without_waiting_and_leave_the_reserve(dsn):
    """A hot bucket with two thieves: the first holds the last 3 rows (its steal in flight, not
    committed); the second takes the rows before them, at once, and none of the 4 the reserve
    keeps for the owner."""
    ids, stolen = _steal_while_another_holds(
        dsn, lambda ids: ids[-3:], "SELECT id FROM dispatcher_jobs WHERE id = ANY(%s) FOR UPDATE"
    )
    assert stolen == ids[4:7]
