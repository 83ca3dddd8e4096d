"""Properties of the bucket assignor (coordinator/assignor.py), checked with hypothesis.

Every bucket hand-off costs a drain of up to one lease, so beyond "complete and balanced" these
pin down how *little* the assignor moves: the fewest moves any balanced assignment could make,
only the newcomer's share on a join, only the leaver's buckets on a leave, nothing on a re-run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.assignor import assign, moves
from dispatcher.constants import NUM_BUCKETS

# Up to 100 members (more than the 64 buckets) and a few bucket counts besides 64, incl. 0 and 1.
MAX_MEMBERS = 100
bucket_counts = st.one_of(st.just(NUM_BUCKETS), st.integers(0, 96))
# A small name space so that duplicates, re-joins and dead owners that share names happen often.
# (sampled_from, not integers().map: one draw each, which keeps the whole file well under 5 s.)
short_names = st.sampled_from([f"w{i:03d}" for i in range(150)])
any_names = st.one_of(short_names, st.text(max_size=4))  # incl. "" and non-ASCII: ids are opaque
# Dead or departed owners: 5 chars, so never equal to a generated member name (at most 4).
DEAD = [f"gone{i}" for i in range(5)]
FAST = settings(max_examples=60, deadline=None)


def by_owner(assignment: Mapping[int, str | None], num_buckets: int) -> dict[str | None, set[int]]:
    """owner -> its buckets within [0, num_buckets), in one pass (not one pass per member)."""
    owners: dict[str | None, set[int]] = {}
    for b in range(num_buckets):
        owners.setdefault(assignment.get(b), set()).add(b)
    return owners


def min_moves(members: Sequence[str], current: Mapping[int, str | None], num_buckets: int) -> int:
    """The fewest hand-offs ANY complete, balanced assignment needs: a member keeps at most
    min(held, quota) and only r members have quota q + 1, best spent on those holding > q."""
    live = set(members)
    held = Counter(o for b in range(num_buckets) if (o := current.get(b)) in live)
    q, r = divmod(num_buckets, len(live))
    keepable = sum(min(held[m], q) for m in live) + min(r, sum(1 for m in live if held[m] > q))
    return num_buckets - keepable


def check(
    members: Sequence[str], current: Mapping[int, str | None], new: dict[int, str], num_buckets: int
) -> None:
    """Every property a single call must have (1, 2, 6, 7 and minimal movement)."""
    live = sorted(set(members))
    if not live:
        assert new == {}
        return
    # 1. complete: every bucket, exactly one owner, and that owner is live.
    assert sorted(new) == list(range(num_buckets))
    assert set(new.values()) <= set(live)
    # 2. balanced: max - min <= 1, counting members that got nothing as 0.
    counts = Counter(new.values())
    per_member = [counts[m] for m in live]
    assert max(per_member) - min(per_member) <= 1
    assert sum(per_member) == num_buckets
    # 7. keeps what it can: owning <= its quota -> keeps everything; owning more -> keeps quota.
    had, got = by_owner(current, num_buckets), by_owner(new, num_buckets)
    for m in live:
        before, after = had.get(m, set()), got.get(m, set())
        assert len(before & after) == min(len(before), len(after)), m
    # Minimal movement (implies 3 and 4 from a balanced start; checked directly below too).
    moved = sum(1 for b in range(num_buckets) if current.get(b) != new[b])
    assert moved == min_moves(live, current, num_buckets)
    # 6. idempotent: a complete, balanced assignment over the same members moves nothing.
    assert assign(live, new, num_buckets) == new
    assert moves(new, assign(members, new, num_buckets)) == 0


@st.composite
def scenarios(
    draw: st.DrawFn, names: st.SearchStrategy[str] = short_names
) -> tuple[list[str], dict[int, str | None], int]:
    """(members with duplicates, any current state incl. None/dead/out-of-range, num_buckets)."""
    num_buckets = draw(bucket_counts)
    size = draw(st.integers(0, MAX_MEMBERS + 10))  # drawn first: a plain list would stay short
    members = draw(st.lists(names, min_size=size, max_size=size))
    dead = draw(st.lists(st.sampled_from(DEAD), max_size=len(DEAD), unique=True))
    # Owners come from a prefix of the members (plus the dead), so some members hold far more
    # than their quota and others nothing: the skewed states where keeping and tie-breaking matter.
    pool = members[: draw(st.integers(1, max(1, len(members))))] + dead
    owners = st.sampled_from([None, *pool])
    if draw(st.booleans()):  # dense: an owner (or None) for every bucket, as a real view has
        current = dict(
            enumerate(draw(st.lists(owners, min_size=num_buckets, max_size=num_buckets)))
        )
    else:  # sparse, with keys outside [0, num_buckets) that must be ignored
        current = draw(
            st.dictionaries(st.integers(-3, num_buckets + 3), owners, max_size=num_buckets + 6)
        )
    return members, current, num_buckets


@FAST
@given(scenarios())
def test_single_call_properties(scenario: tuple[list[str], dict[int, str | None], int]) -> None:
    members, current, num_buckets = scenario
    check(members, current, assign(members, current, num_buckets), num_buckets)


@settings(max_examples=50, deadline=None)
@given(scenarios(any_names), st.data())
def test_deterministic_under_permutation_duplication_and_dict_order(
    scenario, data: st.DataObject
) -> None:
    # 5. the same input in any other shape gives the same output.
    members, current, num_buckets = scenario
    expected = assign(members, current, num_buckets)
    check(members, current, expected, num_buckets)
    extra = data.draw(st.lists(st.sampled_from(members), max_size=5)) if members else []
    shuffled = data.draw(st.permutations(members + extra))
    reordered = dict(data.draw(st.permutations(list(current.items()))))
    assert assign(shuffled, reordered, num_buckets) == expected
    assert assign(tuple(members), dict(current), num_buckets) == expected


@FAST
@given(scenarios(), short_names)
def test_join_from_balanced_moves_only_the_newcomers_share(scenario, newcomer: str) -> None:
    # 3. from a balanced assignment for N members, a join moves <= ceil(n / (N + 1)) buckets.
    members, current, num_buckets = scenario
    if not members or newcomer in members:
        return
    before = assign(members, current, num_buckets)
    after = assign([*members, newcomer], before, num_buckets)
    check([*members, newcomer], before, after, num_buckets)
    n_members = len(set(members))
    assert moves(before, after) <= math.ceil(num_buckets / (n_members + 1))
    # Tighter, as implemented: exactly floor(n / (N + 1)), all of them to the newcomer.
    assert moves(before, after) == num_buckets // (n_members + 1)
    assert all(after[b] == newcomer for b in before if before[b] != after[b])


@FAST
@given(scenarios(), st.data())
def test_leave_or_death_moves_only_the_leavers_buckets(scenario, data: st.DataObject) -> None:
    # 4. removing members (one, or several dying at once) moves only their buckets.
    members, current, num_buckets = scenario
    live = sorted(set(members))
    if len(live) < 2:
        return
    before = assign(members, current, num_buckets)
    gone = set(
        data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live) - 1, unique=True))
    )
    rest = [m for m in members if m not in gone]
    after = assign(rest, before, num_buckets)  # `before` still names the departed: as after a death
    check(rest, before, after, num_buckets)
    assert all(after[b] == before[b] for b in before if before[b] not in gone)
    assert moves(before, after) == sum(1 for owner in before.values() if owner in gone)


@st.composite
def balanced(draw: st.DrawFn) -> tuple[list[str], dict[int, str], int]:
    """ANY complete, balanced assignment (not only one `assign` made): shuffled buckets, and the
    r bigger shares on any r members, not necessarily the ones `assign` would have picked."""
    num_buckets = draw(bucket_counts)
    size = draw(st.integers(1, MAX_MEMBERS))
    members = draw(st.lists(short_names, min_size=size, max_size=size, unique=True))  # any order
    q, r = divmod(num_buckets, size)
    owners = [m for i, m in enumerate(members) for _ in range(q + (i < r))]
    buckets = draw(st.permutations(range(num_buckets)))
    return members, dict(zip(buckets, owners, strict=True)), num_buckets


@FAST
@given(balanced(), short_names, st.data())
def test_any_balanced_assignment_is_a_fixed_point_and_sticky(
    scenario, newcomer: str, data: st.DataObject
) -> None:
    # 6 for any balanced, complete input; 3 and 4 starting from it.
    members, current, num_buckets = scenario
    assert assign(members, current, num_buckets) == current
    if newcomer not in members:
        joined = assign([*members, newcomer], current, num_buckets)
        assert moves(current, joined) == num_buckets // (len(members) + 1)
        assert all(joined[b] in (current[b], newcomer) for b in current)
    if len(members) > 1:
        leaver = data.draw(st.sampled_from(members))
        left = assign([m for m in members if m != leaver], current, num_buckets)
        assert all(left[b] == current[b] for b in current if current[b] != leaver)


joins = st.tuples(st.just("join"), short_names)
leaves = st.tuples(st.just("leave"), st.integers(0, 10_000))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, MAX_MEMBERS), st.lists(st.one_of(joins, leaves), max_size=40), bucket_counts)
def test_join_leave_sequences(
    start_size: int, ops: list[tuple[str, str | int]], num_buckets: int
) -> None:
    """Start with start_size members (0..100), apply joins/leaves one by one, check each step."""
    members = [f"w{i:03d}" for i in range(start_size)]
    state = assign(members, {}, num_buckets)
    check(members, {}, state, num_buckets)
    for kind, arg in ops:
        if kind == "join":
            assert isinstance(arg, str)
            already = arg in members
            members = [*members, arg]
            new = assign(members, state, num_buckets)
            n_before = len(set(members)) - (0 if already else 1)
            if already:  # re-join of a live member: a duplicate, nothing changes
                assert new == state
            elif n_before:
                assert moves(state, new) <= math.ceil(num_buckets / (n_before + 1))
                assert all(new[b] in (state[b], arg) for b in state)  # only to the newcomer
        else:
            if not members:
                continue
            assert isinstance(arg, int)
            leaver = sorted(set(members))[arg % len(set(members))]
            members = [m for m in members if m != leaver]
            new = assign(members, state, num_buckets)
            if members:
                assert all(new[b] == state[b] for b in state if state[b] != leaver)
        check(members, state, new, num_buckets)
        state = new


def test_fresh_start_gives_contiguous_equal_ranges() -> None:
    assert assign(["b", "a", "d", "c"], {}) == {b: "abcd"[b // 16] for b in range(64)}


def test_three_to_four_members_moves_sixteen_buckets() -> None:
    three = assign(["a", "b", "c"], {})
    four = assign(["a", "b", "c", "d"], three)
    assert moves(three, four) == 16 and Counter(four.values()) == {
        "a": 16,
        "b": 16,
        "c": 16,
        "d": 16,
    }


def test_the_bigger_quotas_go_to_the_biggest_holders() -> None:
    # 10 buckets over 3 members: quotas 4, 3, 3. "c" holds 4 now, so "c" keeps the 4 (not "a").
    current = (
        {b: "c" for b in range(4)} | {b: "a" for b in range(4, 7)} | {b: "b" for b in range(7, 10)}
    )
    assert assign(["a", "b", "c"], current, 10) == current


def test_dead_and_unowned_buckets_go_to_the_live_members() -> None:
    # 4 and -1 are out of range: ignored
    current = {0: "dead", 1: None, 2: "a", 3: "a", 4: "a", -1: "b"}
    assert assign(["a", "b"], current, 4) == {0: "b", 1: "b", 2: "a", 3: "a"}


def test_more_members_than_buckets_gives_one_each_to_the_current_holders() -> None:
    members = [f"m{i}" for i in range(5)]
    current = {0: "m4", 1: "m3"}
    new = assign(members, current, 3)
    assert new[0] == "m4" and new[1] == "m3" and new[2] == "m0"


@pytest.mark.parametrize("num_buckets", [0, 64])
def test_no_members_assigns_nothing(num_buckets: int) -> None:
    assert assign([], {0: "a"}, num_buckets) == {}


def test_zero_buckets() -> None:
    assert assign(["a"], {}, 0) == {}


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="single str"):
        assign("ab", {})
    with pytest.raises(ValueError, match="num_buckets"):
        assign(["a"], {}, -1)


def test_moves_counts_changed_gained_and_lost_owners() -> None:
    # 1 changed, 2 and 3 gained
    assert moves({0: "a", 1: "a", 2: None}, {0: "a", 1: "b", 2: "a", 3: "b"}) == 3
    assert moves({0: "a", 1: None}, {}) == 1  # 0 lost its owner; 1 was and stays unowned
    assert moves({}, {}) == 0


# -- several queues: one group per queue (dispatcher/serve/coordination.py) ------------------------

QUEUES = ["qa", "qb", "qc"]
serving_sets = st.dictionaries(
    short_names, st.sets(st.sampled_from(QUEUES), min_size=1), max_size=12
)


def assign_per_queue(
    serving: Mapping[str, set[str]], current: Mapping[str, Mapping[int, str | None]]
) -> dict[str, dict[int, str]]:
    """What the fleet's group leaders compute together: each queue's buckets among its servers."""
    return {
        q: assign(sorted(m for m, qs in serving.items() if q in qs), current.get(q, {}))
        for q in QUEUES
    }


@FAST
@given(serving=serving_sets, change=serving_sets)
def test_per_queue_assignment_is_balanced_per_queue_minimal_and_only_to_servers(
    serving, change
) -> None:
    first = assign_per_queue(serving, {})
    for q in QUEUES:
        servers = {m for m, qs in serving.items() if q in qs}
        owners = Counter(first[q].values())
        assert set(owners) <= servers, "nobody owns a bucket of a queue it does not serve"
        if servers:
            assert sum(owners.values()) == NUM_BUCKETS, (
                "every bucket of a served queue has an owner"
            )
            counts = [owners.get(m, 0) for m in servers]
            assert max(counts) - min(counts) <= 1, "balanced within each queue"
        else:
            assert not first[q], "a queue nobody serves has no owners"
    # Members change their queue sets: each queue moves only what its own membership change forces.
    second = assign_per_queue(change, first)
    for q in QUEUES:
        before = {m for m, qs in serving.items() if q in qs}
        after = {m for m, qs in change.items() if q in qs}
        # other queues' changes (members joining or leaving them) move nothing here
        if before == after:
            assert second[q] == first[q], f"{q}'s servers did not change, nor may its assignment"
        elif after < before and after:  # only leavers: only their buckets move
            assert moves(first[q], second[q]) == sum(
                1 for owner in first[q].values() if owner not in after
            )
