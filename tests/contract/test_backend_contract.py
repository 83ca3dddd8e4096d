"""The coordination backend contract: the SAME tests on every backend (PostgreSQL with session
locks, PostgreSQL on leases only, Redis), so the coordinator loop can rely on one behaviour.

Against real servers, never a mock (fixtures: conftest.py). Leases are short (about a second) and
every wait polls a condition with a deadline (`wait_until_async`), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from coordinator.backend import BucketChange, ClusterView, owned_by, plan_changes
from coordinator.buckets import NUM_BUCKETS
from coordinator.errors import CoordinatorError, CoordinatorUnavailable, NotLeader
from tests.contract.support import BackendFactory
from tests.helpers import run_async, wait_until_async

LEASE_S = 1.0  # "short": expiry tests wait about this long
FAST_S = 3.0  # an unreachable server must surface within this


def bucket(view: ClusterView, b: int) -> tuple[str | None, str | None, int, bool]:
    s = view.buckets[b]
    return s.owner, s.next_owner, s.epoch, s.revoke_overdue


def assign(b: int, epoch: int, owner: str) -> BucketChange:
    return BucketChange(b, epoch, "assign", owner)


def revoke(b: int, epoch: int, owner: str) -> BucketChange:
    return BucketChange(b, epoch, "revoke", owner)


async def gone(backend: Any, member: str) -> bool:
    return member not in (await backend.view()).members


# --------------------------------------------------------------------------- join and view


def test_a_fresh_cluster_has_every_bucket_unowned(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(1) as [a]:
            view = await a.view()
            assert view.members == () and view.leader is None and view.next_expiry_s is None
            assert [s.bucket for s in view.buckets] == list(range(NUM_BUCKETS))
            assert all(bucket(view, b) == (None, None, 0, False) for b in range(NUM_BUCKETS))

    run_async(main())


def test_heartbeat_makes_a_member_live_and_the_view_shows_it(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.connected(3) as backends:
            # Mixed case: members sort by code point (as Python sorts), whatever the backend.
            for backend, member in zip(backends, ("beta", "alpha", "Zulu"), strict=True):
                await backend.heartbeat(member, 10)
            view = await backends[0].view()
            assert view.members == ("Zulu", "alpha", "beta")
            assert view.leader is None
            assert view.next_expiry_s is not None and 8 < view.next_expiry_s <= 10

    run_async(main())


def test_a_heartbeat_before_expiry_extends_the_lease(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(1) as [a]:
            await a.heartbeat("a", 0.5)
            await a.heartbeat("a", 10)  # renewed before it lapsed
            view = await a.view()
            assert view.members == ("a",)
            assert view.next_expiry_s is not None and view.next_expiry_s > 9

    run_async(main())


def test_next_expiry_is_the_earliest_lease_that_matters(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(1) as [a]:
            await a.heartbeat("a", 8)
            view = await a.view()
            assert view.next_expiry_s is not None and 7 < view.next_expiry_s <= 8
            assert await a.try_lead("a", 3)  # the leader's lease ends earlier
            view = await a.view()
            assert view.next_expiry_s is not None and 2 < view.next_expiry_s <= 3

    run_async(main())


# --------------------------------------------------------------------------- graceful leave


def test_leave_releases_buckets_cancels_hand_offs_to_the_leaver_and_resigns(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.connected(3) as [a, b, c]:
            for backend, member in ((a, "a"), (b, "b"), (c, "c")):
                await backend.heartbeat(member, 10)
            assert await a.try_lead("a", 10)
            await a.apply(
                "a",
                [
                    assign(1, 0, "a"),
                    assign(2, 0, "a"),
                    assign(3, 0, "c"),
                    assign(4, 0, "b"),
                    assign(5, 0, "a"),
                ],
                10,
            )
            await a.apply("a", [revoke(2, 1, "b"), revoke(3, 1, "a"), revoke(5, 1, "a")], 10)

            await a.leave("a")
            view = await b.view()
            assert view.members == ("b", "c") and view.leader is None
            # no hand-off pending: unowned, epoch + 1
            assert bucket(view, 1) == (None, None, 2, False)
            assert bucket(view, 2) == ("b", None, 2, False)  # pending: straight to its next_owner
            assert bucket(view, 3) == ("c", None, 1, False)  # a hand-off *to* the leaver is void
            assert bucket(view, 4) == ("b", None, 1, False)  # others' buckets untouched
            # a "hand-off" to itself is no next owner
            assert bucket(view, 5) == (None, None, 2, False)
            assert all(bucket(view, n) == (None, None, 0, False) for n in range(6, NUM_BUCKETS))
            with pytest.raises(NotLeader):
                await a.apply("a", [], 1)
            assert await b.try_lead("b", 10)  # resigned: free at once, not a lease later

            await c.leave("c")  # a non-leader leaving leaves the leadership alone
            assert (await b.view()).leader == "b"

            await a.heartbeat("a", 10)  # a left member may join again
            assert (await b.view()).members == ("a", "b")

    run_async(main())


# --------------------------------------------------------------------------- death


def test_a_member_whose_lease_lapses_disappears(backend_factory: BackendFactory) -> None:
    """It stops heartbeating but keeps its connection (a stuck process): gone after its lease."""

    async def main() -> None:
        async with backend_factory.connected(2) as [observer, stuck]:
            await observer.heartbeat("obs", 30)
            await stuck.heartbeat("stuck", LEASE_S)
            t0 = time.monotonic()
            assert (await observer.view()).members == ("obs", "stuck")
            await wait_until_async(
                lambda: gone(observer, "stuck"), LEASE_S + 5, "the stuck member's lease to lapse"
            )
            assert time.monotonic() - t0 > LEASE_S * 0.7  # by its lease, not earlier
            assert (await observer.view()).members == ("obs",)

    run_async(main())


def test_closing_a_members_connection(backend_factory: BackendFactory) -> None:
    """What SIGKILL does to a member: PostgreSQL with session locks drops it at once (its lock
    goes with the connection); the lease-only backends keep it until its lease lapses."""

    async def main() -> None:
        async with backend_factory.connected(1) as [observer]:
            killed = backend_factory()
            await killed.connect()
            await killed.heartbeat("killed", 30)
            await killed.close()
            if backend_factory.drops_on_close:
                await wait_until_async(
                    lambda: gone(observer, "killed"), 2, "a closed member to drop at once"
                )
            else:
                assert "killed" in (await observer.view()).members  # still within its lease

    run_async(main())


# --------------------------------------------------------------------------- leadership


def test_leadership_is_exclusive_and_only_the_holder_renews(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            assert await a.try_lead("a", 0.8)  # without a heartbeat first: leading alone suffices
            assert not await b.try_lead("b", 10)
            view = await b.view()
            assert view.leader == "a"
            # b's refused attempt did not extend a's short lease
            assert view.next_expiry_s is not None and view.next_expiry_s <= 0.8
            assert await a.try_lead("a", 10)  # the holder renews
            view = await b.view()
            assert view.leader == "a" and view.next_expiry_s is not None and view.next_expiry_s > 9
            assert not await b.try_lead("b", 10)

    run_async(main())


def test_an_expired_leadership_is_taken_over(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            assert await a.try_lead("a", LEASE_S)
            t0 = time.monotonic()
            await wait_until_async(
                lambda: b.try_lead("b", 10), LEASE_S + 5, "b to take over the expired leadership"
            )
            assert time.monotonic() - t0 > LEASE_S * 0.7  # only once it expired
            assert not await a.try_lead("a", 10)  # a cannot renew what it lost
            assert (await a.view()).leader == "b"

    run_async(main())


# --------------------------------------------------------------------------- bucket changes


def test_apply_respects_the_expected_epoch(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(1) as [a]:
            assert await a.try_lead("a", 10)
            assert await a.apply("a", [assign(3, 0, "a"), assign(4, 0, "b")], 1) == 2
            view = await a.view()
            assert bucket(view, 3) == ("a", None, 1, False) and bucket(view, 4) == (
                "b",
                None,
                1,
                False,
            )
            # the stale change (epoch 0) is skipped, the current one applied, in one call
            assert await a.apply("a", [assign(3, 0, "c"), assign(4, 1, "c")], 1) == 1
            view = await a.view()
            assert bucket(view, 3) == ("a", None, 1, False) and bucket(view, 4) == (
                "c",
                None,
                2,
                False,
            )
            assert await a.apply("a", [assign(4, 1, "c")], 1) == 0  # not applied twice

    run_async(main())


def test_revoke_then_hand_over_moves_the_bucket_and_bumps_the_epoch(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(5, 0, "a")], 10)
            assert await a.apply("a", [revoke(5, 1, "b")], 10) == 1
            view = await a.view()
            assert bucket(view, 5) == ("a", "b", 1, False)  # a revoke keeps the epoch
            assert owned_by(view, "a") == ((), (5,))
            assert owned_by(view, "b") == ((), ())  # not b's to poll before the hand-over
            assert await b.hand_over("b", [5]) == 0  # only the owner hands over
            assert await a.hand_over("a", [5, 6]) == 1  # 6 has nothing pending
            view = await a.view()
            assert bucket(view, 5) == ("b", None, 2, False)
            assert bucket(view, 6) == (None, None, 0, False)
            assert owned_by(view, "b") == ((5,), ())
            assert await a.hand_over("a", [5]) == 0  # no longer a's
            assert await a.hand_over("a", []) == 0

    run_async(main())


def test_cancel_clears_a_pending_revoke(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(1) as [a]:
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(7, 0, "a")], 10)
            await a.apply("a", [revoke(7, 1, "b")], 10)
            assert await a.apply("a", [BucketChange(7, 1, "cancel", None)], 10) == 1
            assert bucket(await a.view(), 7) == ("a", None, 1, False)
            assert await a.hand_over("a", [7]) == 0  # nothing left to hand over

    run_async(main())


def test_a_revoke_becomes_overdue_after_its_deadline(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            await a.heartbeat("a", 10)
            await b.heartbeat("b", 10)
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(9, 0, "a")], 10)
            await a.apply("a", [revoke(9, 1, "b")], 0.3)
            t0 = time.monotonic()
            view = await a.view()
            assert bucket(view, 9) == ("a", "b", 1, False)
            assert plan_changes(view, {9: "b"}) == []  # still waiting for a to hand over

            async def overdue() -> ClusterView | None:
                v = await a.view()
                return v if v.buckets[9].revoke_overdue else None

            view = await wait_until_async(overdue, 5, "the revoke to become overdue")
            assert time.monotonic() - t0 > 0.15
            assert plan_changes(view, {9: "b"}) == [assign(9, 1, "b")]  # the leader may force it
            assert await a.apply("a", plan_changes(view, {9: "b"}), 10) == 1
            assert bucket(await a.view(), 9) == ("b", None, 2, False)

    run_async(main())


# --------------------------------------------------------------------------- leader-only writes


def test_apply_by_a_non_leader_raises_not_leader(backend_factory: BackendFactory) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            with pytest.raises(NotLeader):  # nobody leads
                await a.apply("a", [assign(0, 0, "a")], 1)
            assert await a.try_lead("a", LEASE_S)
            with pytest.raises(NotLeader):  # someone else leads
                await b.apply("b", [assign(0, 0, "b")], 1)

            async def lapsed() -> bool:
                return (await a.view()).leader is None

            await wait_until_async(lapsed, LEASE_S + 5, "a's leadership to lapse")
            with pytest.raises(NotLeader):  # a lost it: its stale plan is refused
                await a.apply("a", [assign(0, 0, "a")], 1)
            assert bucket(await a.view(), 0) == (None, None, 0, False)  # nothing was written

    run_async(main())


def test_an_empty_apply_still_checks_leadership(backend_factory: BackendFactory) -> None:
    """The coordinator learns it was deposed even when it has nothing to change."""

    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            with pytest.raises(NotLeader):  # nobody leads
                await b.apply("b", [], 1)
            assert await a.try_lead("a", 10)
            assert await a.apply("a", [], 1) == 0
            with pytest.raises(NotLeader):  # someone else leads
                await b.apply("b", [], 1)

    run_async(main())


# --------------------------------------------------------------------------- invalid arguments

BAD_PLANS = {
    "unknown kind": [BucketChange(0, 0, "steal", "a")],
    "bucket too high": [assign(NUM_BUCKETS, 0, "a")],
    "negative bucket": [assign(-1, 0, "a")],
    "assign without owner": [BucketChange(0, 0, "assign", None)],
    "revoke without owner": [BucketChange(0, 1, "revoke", "")],
    "bucket twice": [assign(0, 0, "a"), revoke(0, 1, "b")],
    "valid then invalid": [assign(1, 0, "a"), BucketChange(2, 0, "steal", "a")],
}


def _applying(plan: list[BucketChange]) -> Callable[[Any], Awaitable[Any]]:
    return lambda b: b.apply("a", plan, 1)


BAD_CALLS: dict[str, Callable[[Any], Awaitable[Any]]] = {
    **{f"apply: {name}": _applying(plan) for name, plan in BAD_PLANS.items()},
    "hand_over: bucket too high": lambda b: b.hand_over("a", [NUM_BUCKETS]),
    "hand_over: negative bucket": lambda b: b.hand_over("a", [0, -1]),
    "heartbeat: zero lease": lambda b: b.heartbeat("a", 0),
    "try_lead: negative lease": lambda b: b.try_lead("a", -1),
}


@pytest.mark.parametrize("call", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_invalid_arguments_raise_value_error_before_any_io(
    backend_factory: BackendFactory, call: Callable[[Any], Awaitable[Any]]
) -> None:
    async def main() -> None:
        async with backend_factory.dead() as dead:  # never connected, no server: any I/O would fail
            with pytest.raises(ValueError):
                await call(dead)
        async with backend_factory.connected(1) as [a]:
            assert await a.try_lead("a", 10)
            before = await a.view()
            with pytest.raises(ValueError):
                await call(a)
            after = await a.view()
            # nothing written
            assert after.buckets == before.buckets and after.members == before.members

    run_async(main())


# --------------------------------------------------------------------------- error mapping

CALLS: dict[str, Callable[[Any], Awaitable[Any]]] = {
    "connect": lambda b: b.connect(),
    "heartbeat": lambda b: b.heartbeat("a", 10),
    "view": lambda b: b.view(),
    "try_lead": lambda b: b.try_lead("a", 10),
    "apply": lambda b: b.apply("a", [assign(0, 0, "a")], 1),
    "hand_over": lambda b: b.hand_over("a", [0]),
    "leave": lambda b: b.leave("a"),
}


def test_an_unreachable_server_raises_coordinator_unavailable(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.dead() as dead:
            for name, call in CALLS.items():  # connect first: the others run on a failed connect
                t0 = time.monotonic()
                with pytest.raises(CoordinatorUnavailable) as info:
                    await call(dead)
                assert time.monotonic() - t0 < FAST_S, name
                # cause kept
                assert isinstance(info.value.__cause__, backend_factory.driver_error), name

    run_async(main())


def test_other_driver_errors_raise_coordinator_error(backend_factory: BackendFactory) -> None:
    """Anything the driver raises that is not "cannot reach" is a CoordinatorError, never a raw
    driver exception, and never mistaken for an outage."""

    async def main() -> None:
        async with backend_factory.connected(1) as [a]:
            await a.heartbeat("a", 10)
            assert await a.try_lead("a", 10)
            await asyncio.to_thread(backend_factory.corrupt)
            for name, call in (("view", CALLS["view"]), ("leave", CALLS["leave"])):
                with pytest.raises(CoordinatorError) as info:
                    await call(a)
                assert not isinstance(info.value, CoordinatorUnavailable | NotLeader), name
                assert isinstance(info.value.__cause__, backend_factory.driver_error), name
            await a.heartbeat("a", 10)  # the backend itself is still usable

    run_async(main())


def test_a_backend_that_could_not_connect_recovers_on_its_own(
    restartable_factory: BackendFactory,
) -> None:
    """connect() during an outage raises CoordinatorUnavailable, yet the backend stays usable:
    once the server is back, calls succeed without another connect(), the first wait reports a
    change at once (notifications may have been missed), and from then on it is woken as usual."""

    async def main() -> None:
        async with restartable_factory.connected(1) as [other]:
            late = restartable_factory()
            try:
                with restartable_factory.outage():
                    t0 = time.monotonic()
                    with pytest.raises(CoordinatorUnavailable):
                        await late.connect()
                    assert time.monotonic() - t0 < FAST_S
                    with pytest.raises(CoordinatorUnavailable):
                        await other.view()  # and the connected one notices the outage too
                await late.heartbeat("late", 10)
                assert await late.wait_for_change(10) is True  # may have missed some: look again
                # a pooled connection the server dropped: retried
                await other.heartbeat("other", 10)
                assert await late.wait_for_change(10) is True  # the join wakes it
                assert await late.wait_for_change(0.2) is False
                assert (await late.view()).members == ("late", "other")
            finally:
                await late.close()

    run_async(main())


# --------------------------------------------------------------------------- notifications


def test_wait_for_change_wakes_on_another_members_change_only(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            t0 = time.monotonic()
            assert await a.wait_for_change(0.2) is False
            assert time.monotonic() - t0 >= 0.15

            waiter = asyncio.create_task(a.wait_for_change(10))
            # The join must wake a waiter already blocked (one sent before it blocks is kept for it
            # too).
            await wait_until_async(a.waiting.is_set, 5, "a blocks in wait_for_change")
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


def test_a_wait_without_joins_sleeps_through_a_join_but_not_through_what_follows(
    backend_factory: BackendFactory,
) -> None:
    """A follower waits with joins=False: only the leader acts on a join, and its apply (or a
    hand-over, or a leave) is what the follower must see."""

    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            await b.heartbeat("b", 10)
            assert await a.wait_for_change(5) is True  # b joined: a wait with joins wakes
            waiter = asyncio.create_task(a.wait_for_change(10, joins=False))
            await wait_until_async(a.waiting.is_set, 5, "a blocks in wait_for_change")
            t0 = time.monotonic()
            for m in ("c", "d"):  # joins, sent while a waits without joins ...
                await b.heartbeat(m, 10)
            assert await b.try_lead("b", 10)
            await b.apply("b", [assign(0, 0, "c")], 10)  # ... then the leader's apply
            assert await waiter is True  # woken by the apply
            assert time.monotonic() - t0 < 5
            # the joins did not queue a wake-up
            assert await a.wait_for_change(0.2, joins=False) is False
            await b.heartbeat("e", 10)  # nor does a join sent between two waits
            assert await a.wait_for_change(0.3, joins=False) is False
            await b.leave("c")  # a leave does wake a follower
            assert await a.wait_for_change(5, joins=False) is True

    run_async(main())


def test_apply_hand_over_and_leave_notify_only_when_something_changed(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        async with backend_factory.connected(2) as [a, b]:
            await a.heartbeat("a", 10)
            assert await b.wait_for_change(5)
            assert await a.try_lead("a", 10)
            await a.apply("a", [assign(0, 0, "a")], 10)
            assert await b.wait_for_change(5)
            await a.apply("a", [revoke(0, 1, "b")], 10)
            assert await b.wait_for_change(5)
            assert await a.apply("a", [assign(0, 0, "a")], 10) == 0  # nothing applied ...
            assert await a.hand_over("a", [1]) == 0  # ... nothing handed over ...
            assert not await b.wait_for_change(0.2)  # ... nothing to notify
            assert await a.hand_over("a", [0]) == 1
            assert await b.wait_for_change(5)
            await a.leave("a")
            assert await b.wait_for_change(5)

    run_async(main())
