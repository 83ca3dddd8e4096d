"""The PostgreSQL coordination backend and the Coordinator loop, in-process (no worker runtime)."""

import asyncio
from collections import Counter

import psycopg
import pytest

from coordinator.backend import BucketChange, NotLeader
from coordinator.backend_pg import PostgresBackend
from coordinator.coordinator import Coordinator
from tests.helpers import run_async


def assignment_settled(coordinators):
    owned = [c.owned() for c in coordinators]
    if any(o is None for o in owned):
        return False
    flat = [b for o in owned for b in o]
    counts = [len(o) for o in owned]
    return sorted(flat) == list(range(64)) and max(counts) - min(counts) <= 1


async def wait_for(predicate, timeout_s, what):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for: {what}")
        await asyncio.sleep(0.02)


def test_members_split_the_buckets_and_rebalance_on_join_and_leave(dsn):
    async def main():
        members = [Coordinator(PostgresBackend(dsn), f"m{i}", lease_s=3, poll_s=0.5) for i in range(3)]
        for m in members:
            await m.start()
        await wait_for(lambda: assignment_settled(members), 10, "3 members own disjoint balanced shares")
        before = {b: m.member for m in members for b in m.owned()}
        joiner = Coordinator(PostgresBackend(dsn), "m3", lease_s=3, poll_s=0.5)
        await joiner.start()
        await wait_for(lambda: assignment_settled(members + [joiner]), 5, "4 members settled after a join")
        after = {b: m.member for m in members + [joiner] for b in m.owned()}
        moved = sum(before[b] != after[b] for b in range(64))
        assert moved == 16  # exactly the joiner's share: ceil(64/4)
        leaver = members.pop(0)
        their = set(leaver.owned())
        await leaver.stop()
        await wait_for(lambda: assignment_settled(members + [joiner]), 5, "3 members settled after a leave")
        final = {b: m.member for m in members + [joiner] for b in m.owned()}
        assert {b for b in range(64) if final[b] != after[b]} == their  # only the leaver's buckets moved
        for m in members + [joiner]:
            await m.stop()

    run_async(main())


def test_leadership_is_exclusive_and_only_the_leader_writes(dsn):
    async def main():
        a, b = PostgresBackend(dsn), PostgresBackend(dsn)
        await a.connect()
        await b.connect()
        await a.heartbeat("a", 3)
        await b.heartbeat("b", 3)
        assert await a.try_lead("a", 3) is True
        assert await b.try_lead("b", 3) is False
        assert await a.try_lead("a", 3) is True  # renewal by the holder
        view = await b.view()
        assert view.leader == "a" and view.members == ("a", "b")
        change = BucketChange(0, view.buckets[0].epoch, "assign", "b")
        with pytest.raises(NotLeader):
            await b.apply("b", [change], 3)
        assert await a.apply("a", [change], 3) == 1
        assert await a.apply("a", [change], 3) == 0  # stale epoch: not applied twice
        await a.leave("a")
        assert await b.try_lead("b", 3) is True  # resigned on leave: taken at once
        await a.close()
        await b.close()

    run_async(main())


def test_a_killed_members_lock_releases_at_once_while_a_stuck_one_expires(dsn):
    """Session lock: a closed connection (what SIGKILL does) drops the member from the view at
    once. Lease: a member that stops heartbeating but keeps its connection drops after the lease."""
    async def main():
        observer, killed, stuck = PostgresBackend(dsn), PostgresBackend(dsn), PostgresBackend(dsn)
        for backend, name in ((observer, "obs"), (killed, "killed"), (stuck, "stuck")):
            await backend.connect()
            await backend.heartbeat(name, 3)
        assert (await observer.view()).members == ("killed", "obs", "stuck")
        await killed.close()  # the connection dies with its process
        loop = asyncio.get_running_loop()
        gone_by = loop.time() + 1.0  # the server ends the backend (and drops its lock) within ms
        while (await observer.view()).members != ("obs", "stuck"):
            assert loop.time() < gone_by, "a closed member was still live a second later"
            await asyncio.sleep(0.01)
        started = loop.time()
        while "stuck" in (await observer.view()).members:
            await observer.heartbeat("obs", 3)
            await asyncio.sleep(0.05)
            assert loop.time() - started < 5
        assert 2.5 < loop.time() - started  # dropped by its lease (3 s), not earlier
        await observer.close()
        await stuck.close()

    run_async(main())


def test_without_session_locks_liveness_rests_on_the_lease(dsn):
    async def main():
        observer, killed = PostgresBackend(dsn, session_locks=False), PostgresBackend(dsn, session_locks=False)
        await observer.connect()
        await killed.connect()
        await killed.heartbeat("killed", 3)
        await killed.close()
        assert "killed" in (await observer.view()).members  # still within its lease
        await observer.close()

    run_async(main())


def test_cooperative_hand_off_waits_for_the_claim_in_flight(dsn):
    """A bucket moving away from a live owner is handed over only after the owner's claim fence
    is free, and the epoch rises once per change of hands."""
    async def main():
        old = Coordinator(PostgresBackend(dsn), "old", lease_s=3, poll_s=0.5)
        fence = asyncio.Lock()
        old.bind_claim_fence(fence)
        await old.start()
        await wait_for(lambda: len(old.owned() or ()) == 64, 5, "single member owns everything")
        await fence.acquire()  # a claim is in flight on the old owner
        new = Coordinator(PostgresBackend(dsn), "new", lease_s=3, poll_s=0.5)
        await new.start()
        await wait_for(lambda: len(old.owned()) == 32, 5, "old owner stopped polling what it gives away")
        await asyncio.sleep(0.3)
        assert new.owned() == (), "new owner must not poll before the old owner's claim finished"
        fence.release()
        await wait_for(lambda: assignment_settled([old, new]), 5, "hand-off completed")
        epochs = Counter(s.epoch for s in (await new.backend.view()).buckets)
        assert epochs == Counter({1: 32, 2: 32})  # 1: first assignment; 2: moved once more
        await old.stop()
        await new.stop()

    run_async(main())


def test_backend_outage_longer_than_the_lease_degrades_then_recovers(dsn, pg_admin_dsn):
    """Coordination tables unreachable (here: every coordinator connection refused) for longer
    than the lease -> owned() is None (SKIP LOCKED); back -> the assignment returns."""
    async def main():
        member = Coordinator(PostgresBackend(dsn), "m", lease_s=3, poll_s=0.5)
        await member.start()
        await wait_for(lambda: member.owned() is not None and len(member.owned()) == 64, 5, "owns all")
        dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND application_name LIKE 'dispatcher-coordinator%%'", (dbname,))
            try:
                await wait_for(lambda: member.owned() is None, 10, "degraded after the lease")
            finally:
                admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
        await wait_for(lambda: member.owned() is not None and len(member.owned()) == 64, 10, "recovered")
        await member.stop()

    run_async(main())
