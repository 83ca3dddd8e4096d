"""Which member owns which bucket: a pure, deterministic function of (live members, current owners).

Balanced (quotas differ by at most one) and moving the fewest buckets any balanced assignment can;
ties are broken by member id, so any member can recompute the leader's plan. Why and how:
docs/design/coordinator.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .buckets import NUM_BUCKETS


def assign(
    members: Sequence[str], current: Mapping[int, str | None], num_buckets: int = NUM_BUCKETS
) -> dict[int, str]:
    """members + current assignment -> new assignment (every bucket -> one member).

    `current` may name owners that are no longer members (dead or departed: their buckets are
    free), map a bucket to None (unowned), or omit buckets (unowned too). Keys outside
    [0, num_buckets) are ignored, so a stale row from a larger bucket count cannot break a plan.
    No members -> {}: there is nobody to give a bucket to.
    """
    if isinstance(members, str):  # a str is a Sequence[str]: "w1" would become members "1" and "w"
        raise TypeError("members must be a sequence of member ids, not a single str")
    if num_buckets < 0:
        raise ValueError(f"num_buckets must be >= 0, got {num_buckets}")
    ordered = sorted(set(members))
    if not ordered:
        return {}

    # Who holds what now, among live members only; read bucket by bucket (order-independent).
    held: dict[str, list[int]] = {m: [] for m in ordered}
    for bucket in range(num_buckets):
        owner = current.get(bucket)
        if owner is not None and owner in held:
            held[owner].append(bucket)  # ascending, since buckets are visited in order

    # Quotas: 64 buckets over 5 members -> q = 12, r = 4: four members get 13, one gets 12.
    # More members than buckets (100 over 64) -> q = 0, r = 64: 64 members get 1, 36 get 0.
    q, r = divmod(num_buckets, len(ordered))
    by_holding = sorted(ordered, key=lambda m: (-len(held[m]), m))
    bigger = set(by_holding[:r])
    quota = {m: q + (m in bigger) for m in ordered}

    # Keep up to quota (the lowest-numbered buckets); everything else goes to the free pool.
    result: dict[int, str] = {}
    for m in ordered:
        for bucket in held[m][: quota[m]]:
            result[bucket] = m
    free = iter([b for b in range(num_buckets) if b not in result])  # ascending
    for m in ordered:
        for _ in range(max(0, quota[m] - len(held[m]))):
            result[next(free)] = m  # sum(quota) == num_buckets, so the pool never runs dry
    return dict(sorted(result.items()))


def moves(old: Mapping[int, str | None], new: Mapping[int, str]) -> int:
    """How many buckets change owner from `old` to `new`: the number of hand-offs a plan costs.

    A bucket unowned before (None or missing) and owned after counts as a move; a bucket owned
    before and missing after (e.g. no members left) counts too; unowned in both does not.
    """
    return sum(1 for bucket in old.keys() | new.keys() if old.get(bucket) != new.get(bucket))
