"""What a coordination backend (PostgreSQL, Redis) must provide, and the leader's pure planning.

The protocol is deliberately small: members heartbeat, one member leads, everyone reads one
`ClusterView`, the leader writes `BucketChange`s, and an old owner completes the hand-off of a
bucket it was asked to give up. All times are the backend's clock (PostgreSQL `now()`, Redis
`TIME`), never a worker's.

Ownership of a bucket moves in one of two ways:
- **direct**: the owner is gone (dead, left, or never set): owner := target, epoch + 1;
- **cooperative**: the owner is alive: the leader sets `next_owner` (a revoke request with a
  deadline); the old owner stops polling the bucket, waits for its in-flight claim to finish,
  then hands it over itself (owner := next_owner, epoch + 1). If it has not done so by the
  deadline (one lease), the leader forces it.
A bucket's epoch rises every time it changes hands, so (bucket, epoch) names exactly one owner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dispatcher.errors import DispatcherError


class CoordinatorUnavailable(DispatcherError):
    """The coordination backend cannot be reached right now."""


class NotLeader(DispatcherError):
    """A leader-only write was refused: leadership was lost (or never held)."""


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
    kind: str  # "assign" (direct, epoch + 1), "revoke" (set next_owner), "cancel" (clear next_owner)
    owner: str | None  # the target owner (assign, revoke); None for cancel


class CoordinatorBackend(Protocol):
    """One connection's worth of coordination, used by one member's coordinator loop."""

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def heartbeat(self, member: str, lease_s: float) -> None:
        """Register or refresh `member`; it is live until backend-now + lease_s."""

    async def leave(self, member: str) -> None:
        """Graceful exit: drop the member, release its buckets (to their next_owner if a hand-off
        was pending, else unowned), resign leadership if held, notify everyone."""

    async def try_lead(self, member: str, lease_s: float) -> bool:
        """Win a free or expired leadership, or renew our own (only where leader = member)."""

    async def view(self) -> ClusterView: ...

    async def apply(self, leader: str, changes: Sequence[BucketChange], revoke_deadline_s: float) -> int:
        """Leader-only: apply changes whose expected_epoch still matches; notify. Returns how many
        were applied. Raises NotLeader if `leader` does not hold a live leadership."""

    async def hand_over(self, member: str, buckets: Sequence[int]) -> int:
        """Old owner completes pending hand-offs it holds: owner := next_owner, epoch + 1; notify."""

    async def wait_for_change(self, timeout_s: float) -> bool:
        """Block until another member notifies a change (True) or the timeout passes (False)."""


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
        elif not owner_alive or state.revoke_overdue and state.next_owner == want:
            changes.append(BucketChange(state.bucket, state.epoch, "assign", want))
        elif state.next_owner != want:
            changes.append(BucketChange(state.bucket, state.epoch, "revoke", want))
    return changes


def current_owners(view: ClusterView) -> dict[int, str | None]:
    """The assignor's input: who owns each bucket now (a pending next_owner counts as the owner
    to be, so a plan in progress is not undone by the next rebalance)."""
    return {s.bucket: s.next_owner or s.owner for s in view.buckets}


def owned_by(view: ClusterView, member: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(buckets `member` may poll, buckets it must hand over)."""
    poll = tuple(s.bucket for s in view.buckets if s.owner == member and s.next_owner in (None, member))
    give = tuple(s.bucket for s in view.buckets if s.owner == member and s.next_owner not in (None, member))
    return poll, give

