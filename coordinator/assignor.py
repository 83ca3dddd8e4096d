"""Which member owns which bucket: a pure function of (live members, current owners).

The leader calls `assign` on every membership change and writes the difference. Every bucket that
changes hands costs a cooperative hand-off (the old owner drains its in-flight claim, up to one
lease), so the assignor's job is to be balanced *and* to move as few buckets as possible:

- quotas: with n buckets and N members, everyone gets q = n // N and r = n % N members get q + 1.
  The q + 1 slots go to the members that hold the most buckets now, so a member already holding
  q + 1 is not made to give one up just to hand it to somebody else;
- each member keeps what it holds up to its quota (the lowest-numbered buckets if it holds more);
- the rest (excess, unowned, owned by a dead or departed member) is handed out, ascending, to the
  members below quota, in member order.

This moves the fewest buckets any balanced assignment can: a member can keep at most
min(held, quota) buckets, and giving the r bigger quotas to the biggest holders maximises that sum.
Consequences the tests check: from a balanced state, a join moves only the newcomer's quota
(<= ceil(n / (N + 1)): 64 buckets, 3 -> 4 members moves 16), a leave or death moves only the
leaver's buckets, and a balanced, complete assignment is a fixed point (nothing moves).

Deterministic by construction: members are deduplicated and sorted, `current` is only read by
bucket number (never iterated, so its insertion order cannot matter), and every tie is broken by
member id. That lets any member recompute the leader's plan and get the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .buckets import NUM_BUCKETS


def assign(members: Sequence[str], current: Mapping[int, str | None], num_buckets: int = NUM_BUCKETS) -> dict[int, str]:
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
