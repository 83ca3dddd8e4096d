"""The Coordinator loop over the PostgreSQL backend, in-process (no worker runtime), and what only
the PostgreSQL backend has (session advisory locks). The behaviour every backend shares is the
contract suite's: tests/contract/."""

import asyncio
import logging
import time
from collections import Counter

import psycopg
import pytest

from coordinator.backend_pg import PostgresBackend
from coordinator.coordinator import Coordinator
from coordinator.errors import CoordinatorError
from tests.helpers import fetchval, run_async, wait_until_async


def assignment_settled(coordinators):
    owned = [c.owned() for c in coordinators]
    if any(o is None for o in owned):
        return False
    flat = [b for o in owned for b in o]
    counts = [len(o) for o in owned]
    return sorted(flat) == list(range(64)) and max(counts) - min(counts) <= 1


async def ticks(coordinator, n, timeout_s):
    """Wait for `n` more adopted views of `coordinator` (its loop's ticks): the n-th began after
    this call."""
    for i in range(n):
        coordinator.adopted.clear()
        await wait_until_async(
            coordinator.adopted.is_set, timeout_s, f"{coordinator.member}'s tick {i + 1} of {n}"
        )


# --------------------------------------------------------------------------- the loop


def test_members_split_the_buckets_and_rebalance_on_join_and_leave(dsn):
    async def main():
        members = [
            Coordinator(PostgresBackend(dsn), f"m{i}", lease_s=3, poll_s=0.5) for i in range(3)
        ]
        for m in members:
            await m.start()
        await wait_until_async(
            lambda: assignment_settled(members), 10, "3 members own disjoint balanced shares"
        )
        before = {b: m.member for m in members for b in m.owned()}
        joiner = Coordinator(PostgresBackend(dsn), "m3", lease_s=3, poll_s=0.5)
        await joiner.start()
        await wait_until_async(
            lambda: assignment_settled([*members, joiner]), 5, "4 members settled after a join"
        )
        after = {b: m.member for m in [*members, joiner] for b in m.owned()}
        moved = sum(before[b] != after[b] for b in range(64))
        assert moved == 16  # exactly the joiner's share: ceil(64/4)
        leaver = members.pop(0)
        their = set(leaver.owned())
        await leaver.stop()
        await wait_until_async(
            lambda: assignment_settled([*members, joiner]), 5, "3 members settled after a leave"
        )
        final = {b: m.member for m in [*members, joiner] for b in m.owned()}
        # only the leaver's buckets moved
        assert {b for b in range(64) if final[b] != after[b]} == their
        for m in [*members, joiner]:
            await m.stop()

    run_async(main())


def test_members_starting_together_get_one_assignment_once_they_settle(dsn):
    """A group without live owners is assigned once no member has joined for the settle time:
    members joining one after another all claim with SKIP LOCKED (owned() None) until then, and
    every bucket changes hands exactly once (epoch 1): no hand-off from a first member that took
    all."""

    async def main():
        members = []
        for i in range(3):
            members.append(
                Coordinator(
                    PostgresBackend(dsn), f"m{i}", lease_s=6, poll_s=0.5, initial_settle_s=3
                )
            )
            await members[-1].start()
            # Each start() ends after its member's first round, well inside the 3 s settle time.
            # still settling
            assert [(m.owned(), m.state) for m in members] == [(None, "joining")] * len(members)
        await wait_until_async(lambda: assignment_settled(members), 10, "3 members assigned")
        await wait_until_async(
            lambda: all(m.state == "member" for m in members), 5, "3 members ready"
        )
        epochs = Counter(s.epoch for s in (await members[0].backend.view()).buckets)
        assert epochs == Counter({1: 64})
        joiner = Coordinator(PostgresBackend(dsn), "m3", lease_s=6, poll_s=0.5)
        await joiner.start()  # a group with live owners: the join moves buckets without delay
        await wait_until_async(
            lambda: assignment_settled([*members, joiner]), 5, "4 members settled after a join"
        )
        for m in [*members, joiner]:
            await m.stop()

    run_async(main())


def test_cooperative_hand_off_waits_for_on_revoke(dsn):
    """A bucket moving away from a live owner is first dropped from owned(), then on_revoke is
    awaited (the worker's claim in flight finishing), and only then handed over; the epoch rises
    once per change of hands. Stopping revokes whatever is still owned before leaving."""

    async def main():
        claim_in_flight = asyncio.Lock()
        revoked = []

        async def on_revoke(buckets):
            revoked.append((buckets, old.owned()))
            async with claim_in_flight:
                pass

        # on_revoke bound: 2 s
        old = Coordinator(PostgresBackend(dsn), "old", lease_s=6, poll_s=0.5)
        await old.start(on_revoke=on_revoke)
        await wait_until_async(
            lambda: len(old.owned() or ()) == 64, 5, "single member owns everything"
        )
        await claim_in_flight.acquire()
        new = Coordinator(PostgresBackend(dsn), "new", lease_s=6, poll_s=0.5)
        await new.start()
        await wait_until_async(
            lambda: len(old.owned()) == 32, 5, "old owner stopped polling what it gives away"
        )
        await wait_until_async(lambda: revoked, 5, "on_revoke called")
        given, owned_meanwhile = revoked[0]
        assert len(given) == 32 and not set(given) & set(owned_meanwhile)  # no longer advertised
        # A negative check: nothing may move while the claim is in flight. Its window is two ticks
        # of the new member (~0.5 s each): the second starts after on_revoke was called, so it
        # reads a view from after any hand-over an eager old owner would already have made. That
        # is well within old's bound on on_revoke (lease / 3 = 2 s).
        await ticks(new, 2, 5)
        assert new.owned() == (), "new owner must not poll before the old owner's claim finished"
        claim_in_flight.release()
        await wait_until_async(lambda: assignment_settled([old, new]), 5, "hand-off completed")
        assert set(new.owned()) == set(given)
        epochs = Counter(s.epoch for s in (await new.backend.view()).buckets)
        assert epochs == Counter({1: 32, 2: 32})  # 1: first assignment; 2: moved once more
        remaining = old.owned()
        await old.stop()
        assert revoked[-1][0] == remaining  # leaving revokes the rest first
        await new.stop()

    run_async(main())


def test_a_stuck_on_revoke_delays_the_hand_over_by_a_bounded_time(dsn, caplog):
    async def main():
        calls = []

        async def stuck(buckets):
            calls.append(buckets)
            await asyncio.Event().wait()  # never returns

        old = Coordinator(PostgresBackend(dsn), "old", lease_s=6, poll_s=0.5)
        await old.start(on_revoke=stuck)
        await wait_until_async(
            lambda: len(old.owned() or ()) == 64, 5, "single member owns everything"
        )
        new = Coordinator(PostgresBackend(dsn), "new", lease_s=6, poll_s=0.5)
        await new.start()
        await wait_until_async(lambda: calls, 5, "on_revoke called")
        t0 = time.monotonic()
        await wait_until_async(
            lambda: assignment_settled([old, new]), 10, "hand-off completed despite on_revoke"
        )
        waited = time.monotonic() - t0
        # handed over by old after its bound (lease / 3 = 2 s), well before the leader would
        # force it (a lease: 6 s); and the loop kept running (it settled, and still answers).
        assert 1.5 < waited < 5, waited
        assert any(
            "overran" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
        )
        assert old.running
        await old.stop()
        await new.stop()

    run_async(main())


def test_a_failing_on_revoke_is_logged_and_the_hand_over_still_happens(dsn, caplog):
    async def main():
        async def failing(buckets):
            raise RuntimeError("worker bug")

        old = Coordinator(PostgresBackend(dsn), "old", lease_s=6, poll_s=0.5)
        await old.start(on_revoke=failing)
        await wait_until_async(
            lambda: len(old.owned() or ()) == 64, 5, "single member owns everything"
        )
        new = Coordinator(PostgresBackend(dsn), "new", lease_s=6, poll_s=0.5)
        await new.start()
        await wait_until_async(
            lambda: assignment_settled([old, new]), 5, "hand-off completed despite on_revoke"
        )
        assert any(
            "raised" in r.getMessage() and r.exc_info
            for r in caplog.records
            if r.levelno == logging.ERROR
        )
        await old.stop()
        await new.stop()

    run_async(main())


def test_backend_outage_longer_than_the_lease_degrades_then_recovers(dsn, pg_admin_dsn):
    """Coordination tables unreachable (here: every coordinator connection refused) for longer
    than the lease -> owned() is None (SKIP LOCKED); back -> the assignment returns."""

    async def main():
        member = Coordinator(PostgresBackend(dsn), "m", lease_s=3, poll_s=0.5)
        await member.start()
        await wait_until_async(
            lambda: member.owned() is not None and len(member.owned()) == 64, 5, "owns all"
        )
        dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'dispatcher-coordinator%%'",
                (dbname,),
            )
            try:
                await wait_until_async(
                    lambda: member.owned() is None, 10, "degraded after the lease"
                )
            finally:
                admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
        await wait_until_async(
            lambda: member.owned() is not None and len(member.owned()) == 64, 10, "recovered"
        )
        await member.stop()

    run_async(main())


def test_until_its_first_view_a_member_claims_everything_with_skip_locked(dsn):
    """A member that has not joined yet has no share to keep to: owned() is None (SKIP LOCKED
    over all buckets) from the start, not after a lease of owning nothing. Here the join fails
    (the owners table renamed away) and the lease is long, so None can only come from joining."""

    async def main():
        member = Coordinator(PostgresBackend(dsn), "m", lease_s=60, poll_s=0.5)
        assert (member.owned(), member.state) == (None, "joining")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "ALTER TABLE dispatcher_bucket_owners RENAME TO dispatcher_bucket_owners_away"
            )
            try:
                await member.start()
                await ticks(member, 0, 1)
                assert (member.owned(), member.state) == (None, "joining")
                assert member.running  # retrying in the background
            finally:
                conn.execute(
                    "ALTER TABLE dispatcher_bucket_owners_away RENAME TO dispatcher_bucket_owners"
                )
        member.changed.clear()
        await wait_until_async(lambda: member.owned() == tuple(range(64)), 10, "joined: owns all")
        assert member.state == "member" and member.changed.is_set()  # the worker is told to switch
        await member.stop()
        assert member.owned() == ()

    run_async(main())


def test_the_loop_outlives_backend_errors_that_are_not_outages(dsn):
    """A failing backend (here: its table renamed away, so every view is a CoordinatorError, not
    CoordinatorUnavailable) does not end the loop: past a lease it degrades, then recovers."""

    async def main():
        member = Coordinator(PostgresBackend(dsn), "m", lease_s=3, poll_s=0.5)
        await member.start()
        await wait_until_async(lambda: len(member.owned() or ()) == 64, 5, "owns all")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "ALTER TABLE dispatcher_bucket_owners RENAME TO dispatcher_bucket_owners_away"
            )
            try:
                await wait_until_async(
                    lambda: member.owned() is None, 10, "degraded after the lease"
                )
                assert member.running
            finally:
                conn.execute(
                    "ALTER TABLE dispatcher_bucket_owners_away RENAME TO dispatcher_bucket_owners"
                )
        await wait_until_async(lambda: len(member.owned() or ()) == 64, 10, "recovered")
        await member.stop()

    run_async(main())


# --------------------------------------------------------------------------- session advisory locks


@pytest.mark.parametrize("session_locks", [True, False])
def test_a_leader_whose_connection_dies_is_replaced_at_once_only_with_session_locks(
    dsn, session_locks
):
    async def main():
        a, b = (
            PostgresBackend(dsn, session_locks=session_locks),
            PostgresBackend(dsn, session_locks=session_locks),
        )
        await a.connect()
        await b.connect()
        assert await a.try_lead("a", 30)
        assert not await b.try_lead("b", 30)
        await a.close()  # what SIGKILL does: the connection, and with it a's session lock, is gone
        if session_locks:
            await wait_until_async(
                lambda: b.try_lead("b", 30), 2, "the dead leader's lock to free the leadership"
            )
            term = fetchval(dsn, "SELECT term FROM dispatcher_leader")
            assert term == 2  # a new term: leadership changed hands
        else:
            assert not await b.try_lead("b", 30)  # only the lease decides
        await b.close()

    run_async(main())


def test_a_member_lock_held_by_another_session_is_a_coordinator_error(dsn):
    """Two live processes with one worker id: the second cannot take the member's lock. That is
    a conflict, not an outage (CoordinatorError, not CoordinatorUnavailable)."""

    async def main():
        first, second = PostgresBackend(dsn), PostgresBackend(dsn)
        await first.connect()
        await second.connect()
        await first.heartbeat("same", 10)
        with pytest.raises(CoordinatorError, match="held by another session") as info:
            await second.heartbeat("same", 10)
        assert type(info.value) is CoordinatorError
        await first.close()  # the lock goes with the connection ...

        async def took_over():  # ... so the second may now take over the id
            try:
                await second.heartbeat("same", 10)
            except CoordinatorError:
                return False
            return True

        await wait_until_async(took_over, 2, "the second session to take over the id")
        assert (await second.view()).members == ("same",)
        await second.close()

    run_async(main())
