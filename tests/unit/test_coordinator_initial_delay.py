"""The leader's initial delay (Kafka's KIP-134) on a fake clock: when the first assignment of a
group without live owners is made."""

import pytest

from coordinator import leader as leader_module
from coordinator.backend import BucketState, ClusterView
from coordinator.leader import Leader


def view(members: tuple[str, ...], owner: str | None = None) -> ClusterView:
    buckets = tuple(
        BucketState(b, owner, None, 0 if owner is None else 1, False) for b in range(64)
    )
    return ClusterView(members, buckets, members[0] if members else None, None)


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(leader_module.time, "monotonic", lambda: now[0])
    return now


def leader() -> Leader:
    return Leader(None, "a", lease_s=10.0, initial_settle_s=1.0, initial_delay_max_s=5.0)  # type: ignore[arg-type]


def test_the_first_assignment_waits_until_no_member_joined_for_the_settle_time(clock):
    c = leader()
    assert c.initial_delay_s(view(("a",))) == 1.0
    clock[0] += 0.5
    assert c.initial_delay_s(view(("a", "b"))) == 1.0  # a join restarts the wait
    clock[0] += 0.9
    assert c.initial_delay_s(view(("a", "b"))) == pytest.approx(0.1)
    clock[0] += 0.1
    assert c.initial_delay_s(view(("a", "b"))) == 0.0


def test_joins_that_keep_coming_delay_it_at_most_the_cap(clock):
    c = leader()
    members = ["a"]
    for i in range(10):  # a member every 0.5 s
        delay = c.initial_delay_s(view(tuple(members)))
        assert delay == pytest.approx(min(1.0, 5.0 - 0.5 * i))
        members.append(f"m{i}")
        clock[0] += 0.5
    assert c.initial_delay_s(view(tuple(members))) == 0.0  # 5 s after the leader first saw it


def test_no_delay_once_a_bucket_has_a_live_owner_and_dead_owners_do_not_count(clock):
    c = leader()
    assert c.initial_delay_s(view(("a", "b"), owner="b")) == 0.0  # a running group: rebalance now
    assert c.initial_delay_s(view(("a", "b"), owner="gone")) == 1.0  # every owner died: a restart
