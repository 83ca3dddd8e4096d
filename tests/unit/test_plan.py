"""The leader's pure planning (coordinator/backend.py): plan_changes, current_owners, owned_by.

No backend: views are built by hand. The last test simulates the backends' documented semantics
(apply, hand_over) in memory and checks that following the plan always converges on the target.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.assignor import assign
from coordinator.backend import (
    BucketChange,
    BucketState,
    ClusterView,
    check_changes,
    current_owners,
    owned_by,
    plan_changes,
)

N = 8  # a small bucket space keeps the cases readable; nothing in the planning depends on 64


def state(
    bucket: int,
    owner: str | None = None,
    next_owner: str | None = None,
    epoch: int = 1,
    overdue: bool = False,
) -> BucketState:
    return BucketState(bucket, owner, next_owner, epoch, overdue)


def view(members: tuple[str, ...], *states: BucketState, n: int = N) -> ClusterView:
    """A view of `n` buckets: the given states, every other bucket unowned at epoch 0."""
    given_ = {s.bucket: s for s in states}
    buckets = tuple(given_.get(b, BucketState(b, None, None, 0, False)) for b in range(n))
    return ClusterView(
        members=tuple(sorted(members)),
        buckets=buckets,
        leader=members[0] if members else None,
        next_expiry_s=None,
    )


# --------------------------------------------------------------------------- plan_changes


def test_unowned_bucket_is_assigned_directly() -> None:
    v = view(("a",))
    assert plan_changes(v, {0: "a"}) == [BucketChange(0, 0, "assign", "a")]


def test_dead_owners_bucket_is_assigned_directly() -> None:
    v = view(("a",), state(3, owner="gone", epoch=4))
    assert plan_changes(v, {3: "a"}) == [BucketChange(3, 4, "assign", "a")]


def test_dead_owner_with_a_pending_hand_off_is_assigned_directly() -> None:
    """Nobody is left to hand it over: the leader moves it itself."""
    v = view(("a", "b"), state(3, owner="gone", next_owner="b", epoch=2))
    assert plan_changes(v, {3: "b"}) == [BucketChange(3, 2, "assign", "b")]


def test_live_owners_bucket_is_revoked_not_taken() -> None:
    v = view(("a", "b"), state(1, owner="a", epoch=2))
    assert plan_changes(v, {1: "b"}) == [BucketChange(1, 2, "revoke", "b")]


def test_pending_revoke_to_the_same_target_waits_for_the_owner() -> None:
    v = view(("a", "b"), state(1, owner="a", next_owner="b", epoch=2))
    assert plan_changes(v, {1: "b"}) == []


def test_overdue_revoke_to_the_same_target_is_forced() -> None:
    v = view(("a", "b"), state(1, owner="a", next_owner="b", epoch=2, overdue=True))
    assert plan_changes(v, {1: "b"}) == [BucketChange(1, 2, "assign", "b")]


def test_pending_revoke_to_another_target_is_redirected_even_when_overdue() -> None:
    """The target moved on (b left, c joined): the owner is live, so it is asked again, not
    forced."""
    for overdue in (False, True):
        v = view(("a", "c"), state(1, owner="a", next_owner="b", epoch=2, overdue=overdue))
        assert plan_changes(v, {1: "c"}) == [BucketChange(1, 2, "revoke", "c")]


def test_owner_already_the_target_with_a_pending_hand_off_is_cancelled() -> None:
    v = view(("a", "b"), state(1, owner="a", next_owner="b", epoch=2))
    assert plan_changes(v, {1: "a"}) == [BucketChange(1, 2, "cancel", None)]


def test_settled_view_plans_nothing() -> None:
    v = view(("a", "b"), *(state(b, owner="a" if b % 2 else "b", epoch=b + 1) for b in range(N)))
    target = {b: "a" if b % 2 else "b" for b in range(N)}
    assert plan_changes(v, target) == []


def test_buckets_outside_the_target_are_left_alone() -> None:
    v = view(("a",), state(0, owner="gone"), state(1, owner="a", next_owner="b"))
    assert plan_changes(v, {}) == []


def test_one_plan_mixes_kinds_and_uses_each_buckets_own_epoch() -> None:
    v = view(
        ("a", "b"),
        state(0),
        state(1, owner="gone", epoch=5),
        state(2, owner="a", epoch=7),
        state(3, owner="a", next_owner="b", epoch=9),
    )
    target = {0: "a", 1: "b", 2: "b", 3: "a"}
    assert plan_changes(v, target) == [
        BucketChange(0, 1, "assign", "a"),
        BucketChange(1, 5, "assign", "b"),
        BucketChange(2, 7, "revoke", "b"),
        BucketChange(3, 9, "cancel", None),
    ]


# --------------------------------------------------------------------------- current_owners,
# owned_by


def test_current_owners_counts_a_pending_next_owner_as_the_owner() -> None:
    v = view(
        ("a", "b"), state(0, owner="a"), state(1, owner="a", next_owner="b"), state(2, owner="gone")
    )
    owners = current_owners(v)
    assert owners[0] == "a" and owners[1] == "b" and owners[2] == "gone"
    assert all(owners[b] is None for b in range(3, N))
    assert set(owners) == set(range(N))


def test_owned_by_splits_poll_and_give() -> None:
    v = view(
        ("a", "b"),
        state(0, owner="a"),
        state(1, owner="a", next_owner="b"),
        state(2, owner="b"),
        state(3, owner="b", next_owner="a"),
        state(4, owner="a", next_owner="a"),
    )
    assert owned_by(v, "a") == ((0, 4), (1,))  # 4: a revoke to itself is nothing to give
    assert owned_by(v, "b") == ((2,), (3,))  # 3: b must hand it to a, so it stops polling it
    assert owned_by(v, "c") == ((), ())


def test_a_pending_next_owner_does_not_poll_before_the_hand_over() -> None:
    v = view(("a", "b"), state(1, owner="a", next_owner="b"))
    assert 1 not in owned_by(v, "b")[0]


# --------------------------------------------------------------------------- convergence


def _apply(v: ClusterView, changes: list[BucketChange]) -> ClusterView:
    """The backends' apply, in memory (a revoke's deadline is not yet past)."""
    by_bucket = {s.bucket: s for s in v.buckets}
    for c in changes:
        s = by_bucket[c.bucket]
        if s.epoch != c.expected_epoch:
            continue
        if c.kind == "assign":
            s = BucketState(s.bucket, c.owner, None, s.epoch + 1, False)
        elif c.kind == "revoke":
            s = BucketState(s.bucket, s.owner, c.owner, s.epoch, False)
        else:
            s = BucketState(s.bucket, s.owner, None, s.epoch, False)
        by_bucket[c.bucket] = s
    return ClusterView(v.members, tuple(by_bucket[b] for b in sorted(by_bucket)), v.leader, None)


def _hand_over_all(v: ClusterView) -> ClusterView:
    """Every live owner hands over what it was asked to."""
    live = set(v.members)
    out = []
    for s in v.buckets:
        if s.owner in live and s.next_owner not in (None, s.owner):
            s = BucketState(s.bucket, s.next_owner, None, s.epoch + 1, False)
        out.append(s)
    return ClusterView(v.members, tuple(out), v.leader, None)


names = st.sampled_from(["a", "b", "c", "d", "gone1", "gone2"])
bucket_states = st.builds(
    lambda o, n, e: (o, n, e),
    st.one_of(st.none(), names),
    st.one_of(st.none(), names),
    st.integers(0, 5),
)


@settings(max_examples=200, deadline=None)
@given(
    members=st.sets(st.sampled_from(["a", "b", "c", "d"]), min_size=1),
    states=st.lists(bucket_states, min_size=N, max_size=N),
)
def test_following_the_plan_reaches_the_assignors_target(
    members: set[str], states: list[tuple]
) -> None:
    v = view(tuple(members), *(state(b, o, n, e) for b, (o, n, e) in enumerate(states)))
    target: Mapping[int, str] = assign(v.members, current_owners(v), N)
    # plan; the owners hand over; plan again (at most: assign, revoke, hand over)
    for _ in range(3):
        changes = plan_changes(v, target)
        check_changes(changes, N)  # every plan is one the backends accept
        v = _hand_over_all(_apply(v, changes))
    assert plan_changes(v, target) == []
    assert {s.bucket: s.owner for s in v.buckets} == dict(target)
    assert all(s.next_owner is None for s in v.buckets)
