"""What the leader of a group does in its rounds: move the bucket assignment towards
`assign(members, current)`, once a new group has settled.

A group without live owners (a fleet starting, or restarting after every member died) gets its
first assignment only once no member has joined for a moment (the initial delay, Kafka's KIP-134);
meanwhile its members claim with SKIP LOCKED. A running group is rebalanced at once. The member's
side of the protocol (heartbeat, adopt its share, hand over, degrade) is coordinator.py's.
Reasons and measurements: docs/design/coordinator.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from . import metrics
from .assignor import assign, moves
from .backend import ClusterView, CoordinatorBackend, current_owners, plan_changes, unassigned

log = logging.getLogger(__name__)

Assignor = Callable[[Sequence[str], Mapping[int, str | None]], dict[int, str]]

# The first assignment of a group without live owners waits until no member has joined for this
# long (8 processes spawned together on 2 cores joined within ~0.6 s; pods of a Deployment start
# within a few seconds of each other), and at most this long after the leader first saw the
# group so (Kafka waits 3 s, its consumers idle meanwhile; ours claim with SKIP LOCKED).
INITIAL_SETTLE_S = 1.0
INITIAL_DELAY_MAX_S = 5.0


class Leader:
    """One member's rounds as its group's leader (the coordinator calls `rebalance` while it
    leads)."""

    def __init__(
        self,
        backend: CoordinatorBackend,
        member: str,
        *,
        lease_s: float,
        assignor: Assignor = assign,
        initial_settle_s: float = INITIAL_SETTLE_S,
        initial_delay_max_s: float = INITIAL_DELAY_MAX_S,
    ) -> None:
        self._backend = backend
        self._member = member
        self._lease_s = lease_s
        self._assign = assignor
        self._initial_settle_s, self._initial_delay_max_s = initial_settle_s, initial_delay_max_s
        # The initial delay, on the leader's own monotonic clock.
        self._unassigned_since: float | None = None
        self._members_seen: tuple[str, ...] = ()
        self._members_changed_at = 0.0
        # What is left of the initial delay after the last round: the coordinator's loop wakes
        # then, to make the first assignment as soon as the group has settled.
        self.delay_left_s = 0.0

    async def rebalance(self, view: ClusterView) -> ClusterView:
        """Apply the changes that move `view` towards the target assignment, unless the initial
        delay still runs; returns the view after them (`view` itself if nothing moved). Raises
        NotLeader if we were deposed meanwhile, CoordinatorError if the backend fails."""
        self.delay_left_s = self.initial_delay_s(view)
        if self.delay_left_s > 0:
            return view
        started = time.perf_counter()
        target = self._assign(view.members, current_owners(view))
        changes = plan_changes(view, target)
        if not changes:
            return view
        applied = await self._backend.apply(self._member, changes, revoke_deadline_s=self._lease_s)
        for change in changes:
            metrics.BUCKETS_MOVED.labels(change.kind).inc()
        metrics.REBALANCES.labels(_reason(view)).inc()
        metrics.REBALANCE_SECONDS.observe(time.perf_counter() - started)
        log.info(
            "rebalance by %s over %d members: %d changes applied (%d buckets move)",
            self._member,
            len(view.members),
            applied,
            moves(current_owners(view), target),
        )
        return await self._backend.view()

    def initial_delay_s(self, view: ClusterView) -> float:
        """How long the first assignment of a group without live owners still waits (module
        docstring); 0 once a bucket has a live owner."""
        if not unassigned(view):
            self._unassigned_since = None
            return 0.0
        now = time.monotonic()
        if self._unassigned_since is None:
            self._unassigned_since = now
        if view.members != self._members_seen:
            self._members_seen, self._members_changed_at = view.members, now
        settled_at = min(
            self._unassigned_since + self._initial_delay_max_s,
            self._members_changed_at + self._initial_settle_s,
        )
        return max(0.0, settled_at - now)


def _reason(view: ClusterView) -> str:
    """Why a rebalance moved buckets, for dispatcher_coordinator_rebalances_total."""
    live = set(view.members)
    if any(s.owner is not None and s.owner not in live for s in view.buckets):
        return "member_gone"
    if any(s.owner is None for s in view.buckets):
        return "unowned"
    return "balance"
