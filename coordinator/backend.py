"""What a coordination backend (PostgreSQL, Redis) must provide, and the leader's pure planning.

Members heartbeat, one leads, everyone reads one `ClusterView`, the leader writes `BucketChange`s
and an old owner completes the hand-off of a bucket it was asked to give up. A bucket moves
directly (its owner is gone) or cooperatively (the owner drains, then hands over; forced after a
lease); its epoch rises each time. Times are the backend's clock. See docs/design/coordinator.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from .buckets import NUM_BUCKETS

CHANGE_KINDS: Final = ("assign", "revoke", "cancel")
# wait_for_change, in every backend: a burst of notifications (a leader's apply plus the
# hand-overs it triggers, members joining together) arrives over a few ms and costs one wake-up.
# After the first, keep draining until 10 ms pass quietly, at most 100 ms in all. Draining only
# what was already read was flaky: the last message of a burst was routinely still in flight.
DRAIN_QUIET_S: Final = 0.01
DRAIN_MAX_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class BucketState:
    bucket: int
    owner: str | None
    next_owner: str | None  # set while a cooperative hand-off is pending
    epoch: int
    revoke_overdue: bool  # next_owner set and its deadline (backend clock) has passed


@dataclass(frozen=True, slots=True)
class ClusterView:
    members: tuple[str, ...]  # live members, sorted; leaving or expired ones excluded
    buckets: tuple[BucketState, ...]  # one per bucket, by bucket number
    leader: str | None
    # Seconds (backend clock) until the earliest lease that matters expires (a member's or the
    # leader's); None if there is none. Lets the loop wake exactly when a death becomes visible
    # instead of up to a heartbeat interval later.
    next_expiry_s: float | None


@dataclass(frozen=True, slots=True)
class BucketChange:
    bucket: int
    expected_epoch: int  # applied only if the bucket is still at this epoch (no lost updates)
    # "assign" (direct, epoch + 1), "revoke" (set next_owner), "cancel" (clear next_owner)
    kind: str
    owner: str | None  # the target owner (assign, revoke); None for cancel


class CoordinatorBackend(Protocol):
    """One connection's worth of coordination, used by one member's coordinator loop.

    Every backend passes the same contract suite (tests/contract/). Errors: arguments that can
    never be valid raise ValueError before any I/O (see `check_changes`); a backend that cannot
    be reached raises CoordinatorUnavailable; anything else the driver raises becomes
    CoordinatorError; a leader-only write by a non-leader raises NotLeader.
    """

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def heartbeat(self, member: str, lease_s: float) -> None:
        """Register or refresh `member`; it is live until backend-now + lease_s. Notifies the
        others only when the member (re)joins, not on a routine refresh."""

    async def leave(self, member: str) -> None:
        """Graceful exit: drop the member, release its buckets (to their next_owner if a hand-off
        was pending, else unowned), resign leadership if held, notify everyone."""

    async def try_lead(self, member: str, lease_s: float) -> bool:
        """Win a free or expired leadership, or renew our own (only where leader = member)."""

    async def view(self) -> ClusterView: ...

    async def apply(
        self, leader: str, changes: Sequence[BucketChange], revoke_deadline_s: float
    ) -> int:
        """Leader-only: apply changes whose expected_epoch still matches; notify if any was.
        Returns how many were applied. Raises NotLeader if `leader` does not hold a live
        leadership, even for an empty list (so a leader learns it was deposed)."""

    async def hand_over(self, member: str, buckets: Sequence[int]) -> int:
        """Old owner completes pending hand-offs it holds: owner := next_owner, epoch + 1;
        notify."""

    async def wait_for_change(self, timeout_s: float, *, joins: bool = True) -> bool:
        """Block until another member notifies a change (True) or the timeout passes (False).
        Our own notifications do not wake us; a burst of them is one wake-up. `joins=False`:
        another member's (re)join does not wake us either, only the changes that follow it (a
        follower does nothing with a join: the leader rebalances, and its apply notifies)."""


def join_reason(member: str) -> str:
    """The reason a (re)joining member's heartbeat notifies with, in every backend."""
    return f"join {member}"


def wakes_waiter(reason: str, joins: bool) -> bool:
    """Whether another member's notification with `reason` wakes `wait_for_change(joins=joins)`."""
    return joins or not reason.startswith(join_reason(""))


def check_lease(lease_s: float) -> None:
    """A lease below 1 ms is refused: it would mean "already expired" (and Redis refuses PX 0)."""
    if not (isinstance(lease_s, int | float) and math.isfinite(lease_s) and lease_s >= 0.001):
        raise ValueError(f"lease must be at least 1 ms, got {lease_s!r} s")


def check_buckets(buckets: Iterable[int], num_buckets: int = NUM_BUCKETS) -> None:
    for bucket in buckets:
        if not isinstance(bucket, int) or isinstance(bucket, bool) or not 0 <= bucket < num_buckets:
            raise ValueError(f"bucket {bucket!r} out of range 0..{num_buckets - 1}")


def check_changes(changes: Sequence[BucketChange], num_buckets: int = NUM_BUCKETS) -> None:
    """What every backend's `apply` checks before any I/O, so all refuse the same plans the same
    way: a known kind, a bucket in range, an owner for assign and revoke, and at most one change
    per bucket (a second change of the same bucket in one call would depend on the first one's
    new epoch, which one UPDATE cannot see)."""
    seen: set[int] = set()
    for c in changes:
        if c.kind not in CHANGE_KINDS:
            raise ValueError(f"unknown change kind {c.kind!r} (one of {', '.join(CHANGE_KINDS)})")
        check_buckets((c.bucket,), num_buckets)
        if c.kind != "cancel" and not c.owner:
            raise ValueError(f"{c.kind} of bucket {c.bucket} needs an owner")
        if c.bucket in seen:
            raise ValueError(f"bucket {c.bucket} changes twice in one apply")
        seen.add(c.bucket)


def plan_changes(view: ClusterView, target: Mapping[int, str]) -> list[BucketChange]:
    """What the leader writes to move from `view` towards `target` (pure; see module docstring)."""
    live = set(view.members)
    changes: list[BucketChange] = []
    for state in view.buckets:
        want = target.get(state.bucket)
        if want is None:
            continue
        owner_alive = state.owner is not None and state.owner in live
        if state.owner == want:
            if state.next_owner is not None:  # a pending move is no longer wanted
                changes.append(BucketChange(state.bucket, state.epoch, "cancel", None))
        elif not owner_alive or (state.revoke_overdue and state.next_owner == want):
            changes.append(BucketChange(state.bucket, state.epoch, "assign", want))
        elif state.next_owner != want:
            changes.append(BucketChange(state.bucket, state.epoch, "revoke", want))
    return changes


def current_owners(view: ClusterView) -> dict[int, str | None]:
    """The assignor's input: who owns each bucket now (a pending next_owner counts as the owner
    to be, so a plan in progress is not undone by the next rebalance)."""
    return {s.bucket: s.next_owner or s.owner for s in view.buckets}


def unassigned(view: ClusterView) -> bool:
    """No bucket is owned by a live member: a group starting, or starting again after every
    member died (the coordinator's initial delay applies; see coordinator.py)."""
    live = set(view.members)
    return not any(s.owner is not None and s.owner in live for s in view.buckets)


def owned_by(view: ClusterView, member: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(buckets `member` may poll, buckets it must hand over)."""
    poll = tuple(
        s.bucket for s in view.buckets if s.owner == member and s.next_owner in (None, member)
    )
    give = tuple(
        s.bucket for s in view.buckets if s.owner == member and s.next_owner not in (None, member)
    )
    return poll, give
