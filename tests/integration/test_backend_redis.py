"""RedisBackend against a real Redis (never a mock).

The server is `DISPATCHER_TEST_REDIS_URL` when set, else one throwaway embedded Redis per
session; every test gets its own random key prefix, so tests never see each other's state.
Tests that kill or freeze Redis start their own embedded server instead of the shared one.
Timing checks poll with a deadline (`eventually`) rather than sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import redis

from coordinator.backend import BucketChange, ClusterView, CoordinatorUnavailable, NotLeader, owned_by, plan_changes
from coordinator.backend_redis import RedisBackend
from dispatcher.constants import NUM_BUCKETS
from dispatcher.embedded import EmbeddedRedis, start_redis
from tests.helpers import run_async

T = TypeVar("T")
FAST_S = 3.0  # "quickly": a dead Redis must surface within this


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    url = os.environ.get("DISPATCHER_TEST_REDIS_URL")
    if url:
        yield url
        return
    server = start_redis()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def cluster(redis_server_url: str) -> Iterator[tuple[str, str]]:
    """(url, prefix): a key namespace of this test's own; its keys are deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield redis_server_url, prefix
    with redis.Redis.from_url(redis_server_url) as r:
        keys = list(r.scan_iter(match=f"{prefix}:*"))
        if keys:
            r.delete(*keys)


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A private server this test may kill, freeze and restart."""
    server = start_redis()
    try:
        yield server
    finally:
        if server.pid:
            try:
                os.kill(server.pid, signal.SIGCONT)  # in case a test left it frozen
            except ProcessLookupError:
                pass
        server.stop()


@asynccontextmanager
async def backends(url: str, prefix: str, n: int) -> AsyncIterator[list[RedisBackend]]:
    """n connected backends on one cluster, one per simulated member."""
    made = [RedisBackend(url, prefix=prefix) for _ in range(n)]
    try:
        for b in made:
            await b.connect()
        yield made
    finally:
        for b in made:
            await b.close()


async def eventually(probe: Callable[[], Awaitable[T]], timeout_s: float, what: str) -> T:
    """Await `probe()` until it returns something truthy; fail with `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for: {what}")
        await asyncio.sleep(0.02)


async def fails_fast(call: Awaitable[Any]) -> CoordinatorUnavailable:
    t0 = time.monotonic()
    with pytest.raises(CoordinatorUnavailable) as info:
        await call
    assert time.monotonic() - t0 < FAST_S
    assert info.value.__cause__ is not None  # the redis error is kept
    return info.value


def bucket(view: ClusterView, b: int) -> tuple[str | None, str | None, int, bool]:
    s = view.buckets[b]
    return s.owner, s.next_owner, s.epoch, s.revoke_overdue


def assign(b: int, epoch: int, owner: str) -> BucketChange:
    return BucketChange(b, epoch, "assign", owner)


# --------------------------------------------------------------------------- membership


def test_heartbeat_makes_member_live_until_lease_expires(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 1) as [a]:
            empty = await a.view()
            assert empty.members == () and empty.leader is None and empty.next_expiry_s is None
            assert len(empty.buckets) == NUM_BUCKETS
            assert all(s.owner is None and s.next_owner is None and s.epoch == 0 for s in empty.buckets)

            await a.heartbeat("w1", 0.5)
            assert (await a.view()).members == ("w1",)

            async def gone() -> bool:
                return (await a.view()).members == ()

            t0 = time.monotonic()
            await eventually(gone, 5, "w1 to expire")
            assert time.monotonic() - t0 > 0.3  # not before its lease

    run_async(main())


def test_members_are_sorted_and_heartbeat_extends_the_lease(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            await b.heartbeat("zed", 10)
            await a.heartbeat("alpha", 0.3)
            await a.heartbeat("alpha", 10)  # renewed before it lapsed
            view = await a.view()
            assert view.members == ("alpha", "zed")
            assert view.next_expiry_s is not None and view.next_expiry_s > 9

    run_async(main())


def test_next_expiry_is_the_earliest_remaining_lease(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 1) as [a]:
            await a.heartbeat("w1", 8)
            view = await a.view()
            assert view.next_expiry_s is not None and 7.5 < view.next_expiry_s <= 8
            assert await a.try_lead("w1", 3)  # the leader's PTTL is earlier
            view = await a.view()
            assert view.next_expiry_s is not None and 2.5 < view.next_expiry_s <= 3

    run_async(main())


def test_prefixes_isolate_clusters(cluster: tuple[str, str]) -> None:
    url, prefix = cluster

    async def main() -> None:
        async with backends(url, prefix, 1) as [a], backends(url, prefix + "-other", 1) as [other]:
            await a.heartbeat("w1", 10)
            assert await a.try_lead("w1", 10)
            view = await other.view()
            assert view.members == () and view.leader is None
            assert await other.try_lead("w2", 10)  # a separate leadership
            await other.leave("w2")

    run_async(main())


# --------------------------------------------------------------------------- leadership


def test_leadership_is_exclusive_and_only_the_holder_renews(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            assert await a.try_lead("a", 0.6)
            assert not await b.try_lead("b", 10)
            view = await b.view()
            assert view.leader == "a"
            # b's refused attempt must not have extended a's short lease
            assert view.next_expiry_s is not None and view.next_expiry_s <= 0.6
            assert await a.try_lead("a", 10)  # the holder renews
            view = await b.view()
            assert view.next_expiry_s is not None and view.next_expiry_s > 9
            assert not await b.try_lead("b", 10)

    run_async(main())


def test_expired_leadership_can_be_taken_by_another(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            assert await a.try_lead("a", 0.3)
            await eventually(lambda: b.try_lead("b", 10), 5, "b to take over the expired leadership")
            assert not await a.try_lead("a", 10)  # a cannot renew what it lost
            assert (await a.view()).leader == "b"

    run_async(main())


# --------------------------------------------------------------------------- bucket changes


def test_apply_by_a_non_leader_raises_not_leader(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            with pytest.raises(NotLeader):  # nobody leads
                await a.apply("a", [assign(0, 0, "a")], 1)
            assert await a.try_lead("a", 0.3)
            with pytest.raises(NotLeader):
                await b.apply("b", [assign(0, 0, "b")], 1)
            assert await a.apply("a", [], 1) == 0  # an empty plan still checks leadership

            async def lapsed() -> bool:
                return (await a.view()).leader is None

            await eventually(lapsed, 5, "a's leadership to lapse")
            with pytest.raises(NotLeader):  # a lost it: its stale plan is refused
                await a.apply("a", [assign(0, 0, "a")], 1)
            assert bucket(await a.view(), 0) == (None, None, 0, False)

    run_async(main())


def test_apply_respects_expected_epoch(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 1) as [a]:
            assert await a.try_lead("a", 10)
            assert await a.apply("a", [assign(3, 0, "a"), assign(4, 0, "b")], 1) == 2
            view = await a.view()
            assert bucket(view, 3) == ("a", None, 1, False) and bucket(view, 4) == ("b", None, 1, False)
            # stale (epoch 0) changes are skipped, current ones applied, in one call
            assert await a.apply("a", [assign(3, 0, "c"), assign(4, 1, "c")], 1) == 1
            view = await a.view()
            assert bucket(view, 3) == ("a", None, 1, False) and bucket(view, 4) == ("c", None, 2, False)

    run_async(main())


def test_revoke_then_hand_over_moves_the_bucket_and_bumps_the_epoch(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(5, 0, "a")], 10)
            assert await a.apply("a", [BucketChange(5, 1, "revoke", "b")], 10) == 1
            view = await a.view()
            assert bucket(view, 5) == ("a", "b", 1, False)  # a revoke keeps the epoch
            assert owned_by(view, "a") == ((), (5,))
            assert await b.hand_over("b", [5]) == 0  # only the owner hands over
            assert await a.hand_over("a", [5, 6]) == 1  # 6 has nothing pending
            view = await a.view()
            assert bucket(view, 5) == ("b", None, 2, False)
            assert owned_by(view, "b") == ((5,), ())
            assert await a.hand_over("a", [5]) == 0  # no longer a's

    run_async(main())


def test_cancel_clears_a_pending_revoke(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 1) as [a]:
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(7, 0, "a")], 10)
            await a.apply("a", [BucketChange(7, 1, "revoke", "b")], 10)
            assert await a.apply("a", [BucketChange(7, 1, "cancel", None)], 10) == 1
            assert bucket(await a.view(), 7) == ("a", None, 1, False)
            assert await a.hand_over("a", [7]) == 0

    run_async(main())


def test_revoke_becomes_overdue_after_its_deadline(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 1) as [a]:
            await a.heartbeat("a", 10)
            await a.heartbeat("b", 10)
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(9, 0, "a")], 10)
            await a.apply("a", [BucketChange(9, 1, "revoke", "b")], 0.3)
            view = await a.view()
            assert bucket(view, 9) == ("a", "b", 1, False)
            assert plan_changes(view, {9: "b"}) == []  # still waiting for a to hand over

            async def overdue() -> ClusterView | None:
                v = await a.view()
                return v if v.buckets[9].revoke_overdue else None

            t0 = time.monotonic()
            view = await eventually(overdue, 5, "the revoke to become overdue")
            assert time.monotonic() - t0 > 0.15
            assert plan_changes(view, {9: "b"}) == [assign(9, 1, "b")]  # the leader may force it

    run_async(main())


def test_bad_changes_are_refused_before_reaching_redis(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 1) as [a]:
            assert await a.try_lead("a", 10)
            with pytest.raises(ValueError):
                await a.apply("a", [assign(NUM_BUCKETS, 0, "a")], 1)
            with pytest.raises(ValueError):
                await a.apply("a", [BucketChange(0, 0, "steal", "a")], 1)
            with pytest.raises(ValueError):
                await a.hand_over("a", [-1])
            with pytest.raises(ValueError):
                await a.heartbeat("a", 0)

    run_async(main())


def test_leave_releases_buckets_and_leadership(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            for m in ("a", "b", "c"):
                await a.heartbeat(m, 10)
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(1, 0, "a"), assign(2, 0, "a"), assign(3, 0, "c"), assign(4, 0, "b")], 10)
            await a.apply("a", [BucketChange(2, 1, "revoke", "b"), BucketChange(3, 1, "revoke", "a")], 10)

            await a.leave("a")
            view = await b.view()
            assert view.members == ("b", "c") and view.leader is None
            assert bucket(view, 1) == (None, None, 2, False)  # no hand-off pending: unowned
            assert bucket(view, 2) == ("b", None, 2, False)  # pending: straight to next_owner
            assert bucket(view, 3) == ("c", None, 1, False)  # a hand-off *to* a is void
            assert bucket(view, 4) == ("b", None, 1, False)  # others' buckets untouched
            assert await b.try_lead("b", 10)
            with pytest.raises(NotLeader):
                await a.apply("a", [], 1)

    run_async(main())


def test_leave_does_not_release_someone_elses_leadership(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            assert await b.try_lead("b", 10)
            await a.heartbeat("a", 10)
            await a.leave("a")
            assert (await a.view()).leader == "b"

    run_async(main())


# --------------------------------------------------------------------------- notifications


def test_wait_for_change_wakes_on_another_members_change_and_times_out(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            t0 = time.monotonic()
            assert await a.wait_for_change(0.2) is False
            assert time.monotonic() - t0 >= 0.15

            waiter = asyncio.create_task(a.wait_for_change(10))
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            await b.heartbeat("b", 10)  # a join notifies
            assert await waiter is True
            assert time.monotonic() - t0 < 1

            await b.heartbeat("b", 10)  # a routine heartbeat does not
            assert await a.wait_for_change(0.2) is False

            for m in ("c", "d", "e"):  # a burst of joins ...
                await b.heartbeat(m, 10)
            assert await a.wait_for_change(5) is True
            assert await a.wait_for_change(0.2) is False  # ... is one wake-up

            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(0, 0, "a")], 1)  # our own change does not wake us
            assert await a.wait_for_change(0.2) is False
            assert await b.wait_for_change(5) is True  # but it wakes the others

    run_async(main())


def test_apply_hand_over_and_leave_notify(cluster: tuple[str, str]) -> None:
    async def main() -> None:
        async with backends(*cluster, 2) as [a, b]:
            await a.heartbeat("a", 10)
            assert await b.wait_for_change(5)
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(0, 0, "a"), BucketChange(0, 1, "revoke", "b")], 10)
            assert await b.wait_for_change(5)
            assert await a.apply("a", [assign(0, 0, "a")], 10) == 0  # nothing applied ...
            assert not await b.wait_for_change(0.2)  # ... nothing to notify
            await a.hand_over("a", [0])
            assert await b.wait_for_change(5)
            await a.leave("a")
            assert await b.wait_for_change(5)

    run_async(main())


# --------------------------------------------------------------------------- Redis failures


def test_dead_redis_raises_quickly_and_everything_recovers_after_restart(own_redis: EmbeddedRedis) -> None:
    async def main() -> None:
        async with backends(own_redis.url, "fail", 2) as [a, b]:
            await a.heartbeat("a", 30)
            assert await a.try_lead("a", 30)
            await a.apply("a", [assign(0, 0, "a")], 10)
            assert await b.wait_for_change(5)

            own_redis.kill()
            await fails_fast(a.heartbeat("a", 30))
            await fails_fast(a.try_lead("a", 30))
            await fails_fast(a.view())
            await fails_fast(a.apply("a", [assign(1, 0, "a")], 10))
            await fails_fast(a.hand_over("a", [0]))
            await fails_fast(a.leave("a"))
            await fails_fast(b.wait_for_change(30))  # the subscriber notices too
            await fails_fast(b.wait_for_change(30))  # and keeps failing fast while it is down
            late = RedisBackend(own_redis.url, prefix="fail")
            await fails_fast(late.connect())

            await asyncio.to_thread(own_redis.start_again)  # same port, empty: nothing on disk
            try:
                await a.heartbeat("a", 30)  # pooled sockets to the old server are replaced
                view = await b.view()
                assert view.members == ("a",) and view.leader is None
                assert bucket(view, 0) == (None, None, 0, False)
                assert await a.try_lead("a", 30)
                # Notifications sent while b was not subscribed are lost, so its first
                # wait after re-subscribing reports a change at once ...
                assert await b.wait_for_change(5) is True
                assert await late.wait_for_change(5) is True
                # ... and from then on it waits, and wakes, as usual.
                assert await b.wait_for_change(0.2) is False
                waiter = asyncio.create_task(b.wait_for_change(10))
                await asyncio.sleep(0.05)
                await a.apply("a", [assign(0, 0, "a")], 10)
                assert await waiter is True
                await late.heartbeat("late", 30)
                assert await b.wait_for_change(5) is True
            finally:
                await late.close()

    run_async(main())


def test_subscriber_survives_a_restart_while_waiting(own_redis: EmbeddedRedis) -> None:
    async def main() -> None:
        async with backends(own_redis.url, "fail", 2) as [a, b]:
            waiter = asyncio.create_task(b.wait_for_change(30))
            await asyncio.sleep(0.05)
            own_redis.kill()
            with pytest.raises(CoordinatorUnavailable):
                await asyncio.wait_for(waiter, FAST_S)
            await asyncio.to_thread(own_redis.start_again)
            assert await b.wait_for_change(5) is True  # re-subscribed (and maybe missed some)
            waiter = asyncio.create_task(b.wait_for_change(10))
            await asyncio.sleep(0.05)
            await a.heartbeat("a", 10)
            assert await waiter is True

    run_async(main())


def test_close_does_not_raise_when_redis_is_gone(own_redis: EmbeddedRedis) -> None:
    async def main() -> None:
        a = RedisBackend(own_redis.url, prefix="gone")
        await a.connect()
        await a.heartbeat("a", 10)
        own_redis.kill()
        await a.close()
        await a.close()  # idempotent

    run_async(main())


def test_frozen_redis_times_out_quickly_and_recovers(own_redis: EmbeddedRedis) -> None:
    """A hung server (no RST, just silence) is caught by the socket timeout, not a lease."""

    async def main() -> None:
        async with backends(own_redis.url, "frozen", 1) as [a]:
            await a.heartbeat("a", 30)
            os.kill(own_redis.pid, signal.SIGSTOP)
            try:
                await fails_fast(a.view())
                await fails_fast(a.heartbeat("a", 30))
            finally:
                os.kill(own_redis.pid, signal.SIGCONT)
            assert (await a.view()).members == ("a",)  # the data survived: it was only paused

    run_async(main())
