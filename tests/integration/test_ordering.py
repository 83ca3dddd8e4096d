"""Ordering keys at the database: the unique holder index, the plans, and the keys a racing
enqueue leaves without a holder (found by the sweeper). Store level, no worker runtime."""

from __future__ import annotations

import json

import psycopg
import pytest

from dispatcher import enqueue_payloads_sync, enqueue_sync
from dispatcher.api.enqueue import bucket_for
from dispatcher.db.queries import query
from dispatcher.db.rows import Chain
from dispatcher.db.store import JobStore, claim_sql
from dispatcher.runtime.ordering import KeySweeper
from tests.helpers import fetchall, fetchval, plan_nodes, run_async


def test_the_database_refuses_a_second_holder_of_a_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue_sync(conn, "a", ordering_key="k")
        second = enqueue_sync(conn, "a", ordering_key="k")
        assert fetchall(dsn, "SELECT id, status FROM dispatcher_jobs ORDER BY id") == [
            (first, "queued"),
            (second, "waiting"),
        ]
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE dispatcher_jobs SET status = 'queued' WHERE id = %s", (second,))
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'failed', ordering_halted = true WHERE id = %s",
            (first,),
        )
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE dispatcher_jobs SET status = 'queued' WHERE id = %s", (second,))


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_claim_never_reads_the_jobs_waiting_behind_their_keys(dsn, mode):
    """50 keys with 400 jobs each: the claim's index walk reads the 50 holders, not 20,000 rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        keys = [f"key-{i % 50}" for i in range(20_000)]
        enqueue_payloads_sync(conn, "a", [{}] * len(keys), ordering_keys=keys)
        conn.execute("ANALYZE dispatcher_jobs")
        sql = claim_sql(None if mode == "skip_locked" else range(64))
        with conn.transaction(force_rollback=True):
            params = {
                "queue": "default",
                "limit": 500,
                "lease_s": 30.0,
                "worker": "w",
                "token": None,
                "flow_version": 0,
            }
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0][
                "Plan"
            ]
    nodes = list(plan_nodes(plan))
    assert plan["Actual Rows"] == 50, json.dumps(plan)[:2000]
    scanned = sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
        for n in nodes
        if n.get("Index Name", "").startswith("dispatcher_jobs_claim")
    )
    assert scanned <= 50, f"read {scanned} claim-index entries for 50 holders"


@pytest.mark.parametrize("chained", [False, True])
def test_a_keyed_completion_promotes_or_claims_through_the_waiting_index(dsn, chained):
    """100 keys complete their holders: each next job is promoted (queued), or, in buckets the
    completing worker owns, claimed for it in the same statement."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        keys = [f"key-{i % 100}" for i in range(10_000)]
        enqueue_payloads_sync(conn, "a", [{}] * len(keys), ordering_keys=keys)
        conn.execute("ANALYZE dispatcher_jobs")
        held = fetchall(
            dsn,
            "UPDATE dispatcher_jobs SET status = 'running', lock_token = gen_random_uuid() "
            "WHERE status = 'queued' RETURNING id, lock_token::text",
        )
        owned = list(range(64)) if chained else []
        with conn.transaction(force_rollback=True):
            params = {
                "ids": "{" + ",".join(str(i) for i, _ in held) + "}",
                "tokens": "{" + ",".join(t for _, t in held) + "}",
                "channel": "test",
                "chain_queues": ["default"] * len(owned),
                "chain_buckets": "{" + ",".join(map(str, owned)) + "}",
                "chain_limit": 1000,
                "token": "00000000-0000-0000-0000-000000000001",
                "worker": "w",
                "lease_s": 30.0,
                "results_channel": "test",
            }
            sql = query("jobs_complete_owned_keyed").replace(
                "{completion}", query("jobs_complete_owned")
            )
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0]
            statuses = dict(
                conn.execute(
                    "SELECT status, count(*) FROM dispatcher_jobs GROUP BY status"
                ).fetchall()
            )
    nodes = list(plan_nodes(plan["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], json.dumps(plan)[:3000]
    assert "dispatcher_jobs_ordering_waiting_idx" in {n.get("Index Name") for n in nodes}
    assert statuses == {"completed": 100, "running" if chained else "queued": 100, "waiting": 9_800}


def test_a_job_enqueued_as_its_keys_holder_finishes_is_promoted_by_the_sweeper(dsn):
    """The race the holder's statement cannot see: the enqueue decided 'waiting' (a holder ran),
    the holder completed before the enqueue committed, so nobody promoted the new job."""

    async def scenario() -> None:
        store = JobStore(dsn, "w1")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                enqueue_sync(conn, "a", ordering_key="k")
            (holder,) = (await store.jobs_claim("default", 10, 30.0, None)).jobs
            # one transaction, committed after the holder completes
            with psycopg.connect(dsn) as late:
                behind = enqueue_sync(late, "a", ordering_key="k")
                assert (
                    await store.jobs_complete([holder.id], [holder.token], keyed=True)
                ).completed == 1
                late.commit()
            assert (
                fetchval(dsn, "SELECT status FROM dispatcher_jobs WHERE id = %s", (behind,))
                == "waiting"
            )
            assert (await store.jobs_claim("default", 10, 30.0, None)).jobs == [], (
                "an orphan: nobody promoted it"
            )
            sweeper = KeySweeper(store, ("default",))
            await sweeper.tick()
            assert (sweeper.holding, sweeper.promoted) == (True, 1)
            assert [j.id for j in (await store.jobs_claim("default", 10, 30.0, None)).jobs] == [
                behind
            ]
            await sweeper.release()
        finally:
            await store.close()

    run_async(scenario())


def test_the_sweep_goes_through_many_keys_in_pages_and_leaves_held_and_halted_keys_alone(dsn):
    async def scenario() -> None:
        store = JobStore(dsn, "w1")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                keys = [f"key-{i:04d}" for i in range(2_500)] * 2
                enqueue_payloads_sync(conn, "a", [{}] * len(keys), ordering_keys=keys)
                # Orphan every key but the first ten (held) and the next ten (halted).
                conn.execute(
                    "UPDATE dispatcher_jobs SET status = 'failed', ordering_halted = true "
                    "WHERE status = 'queued' AND ordering_key BETWEEN 'key-0010' AND 'key-0019'"
                )
                conn.execute(
                    "UPDATE dispatcher_jobs SET status = 'completed' "
                    "WHERE status = 'queued' AND ordering_key >= 'key-0020'"
                )
            sweeper = KeySweeper(store, ("default",))
            sweeper.PAGE_KEYS = 400  # 2,500 keys: 7 pages, more than one round's 4
            await sweeper.tick()
            assert 0 < sweeper.promoted < 2_480, "one round stops after its pages"
            while sweeper.promoted < 2_480:
                before = sweeper.promoted
                await sweeper.tick()
                assert sweeper.promoted > before, "a later round goes on where the last stopped"
            assert sweeper.promoted == 2_480
            counts = dict(
                fetchall(dsn, "SELECT status, count(*) FROM dispatcher_jobs GROUP BY status")
            )
            assert counts == {"queued": 2_490, "failed": 10, "completed": 2_480, "waiting": 10 + 10}
            await sweeper.tick()
            assert sweeper.promoted == 2_480, "nothing more to promote"
        finally:
            await store.close()

    run_async(scenario())


def test_a_keyed_completion_claims_the_keys_next_job_in_the_buckets_it_is_given(dsn):
    """Partitioned mode's chained claim: a due next job in the chain's buckets comes back running
    under a new token (up to its limit); the others are queued for anyone."""

    async def scenario() -> None:
        store = JobStore(dsn, "w1")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                first = [enqueue_sync(conn, "send", ordering_key=k) for k in "abc"]
                second = [enqueue_sync(conn, "send", {"k": k}, ordering_key=k) for k in "abc"]
            jobs = (await store.jobs_claim("default", 10, 30.0, None)).jobs
            assert sorted(j.id for j in jobs) == first
            mine = Chain(
                ("default", "default"), (bucket_for("a"), bucket_for("b")), limit=1, lease_s=30.0
            )
            done = await store.jobs_complete(
                [j.id for j in jobs], [j.token for j in jobs], keyed=True, chain=mine
            )
            assert done.completed == 3 and len(done.claimed) == 1
            (chained,) = done.claimed
            assert chained.id in second[:2] and chained.token not in {j.token for j in jobs}
            assert (chained.attempts, chained.queue, chained.payload) == (
                1,
                "default",
                {"k": chained.ordering_key},
            )
            rest = [i for i in second if i != chained.id]
            assert fetchall(
                dsn,
                "SELECT id, status, locked_by FROM dispatcher_jobs WHERE id = ANY(%s) ORDER BY id",
                (second,),
            ) == sorted([(chained.id, "running", "w1"), *((i, "queued", None) for i in rest)])
            assert (
                sorted(j.id for j in (await store.jobs_claim("default", 10, 30.0, None)).jobs)
                == rest
            )
            assert (
                await store.jobs_complete([chained.id], [chained.token], keyed=True)
            ).completed == 1
        finally:
            await store.close()

    run_async(scenario())
