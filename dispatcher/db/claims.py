"""The claim statements, built from sql/claim.sql per mode and type filter, and the gated claim:
the one way jobs of a flow-controlled type are claimed (limits: docs/concepts/flow-control.md).

A gated claim is one short transaction: lock the limit rows that bind its jobs, count what runs
under them, claim at most what they allow, spend the rate's tokens. `allowance` is its pure choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dispatcher.constants import NUM_BUCKETS
from dispatcher.db.literals import int_array
from dispatcher.db.queries import query
from dispatcher.db.rows import TypeFilter

_TYPE_FILTERS = {
    None: "",
    False: "AND job_type <> ALL(%(claim_types)s::text[])",
    True: "AND job_type = ANY(%(claim_types)s::text[])",
}


def type_filter(types: TypeFilter | None) -> str:
    """A claim's {type_filter}: nothing, or the types it takes or leaves (%(claim_types)s)."""
    return _TYPE_FILTERS[None if types is None else types.include]


def _finish(selection: str, types: TypeFilter | None, window: str | None = None) -> str:
    """jobs_claim around a selection; `window`: a claim window's CTEs (claim_window), which come
    first and add the `outranked` column."""
    text = query("jobs_claim").replace("{select_ids}", selection)
    if window is None:
        text = text.replace("{window}", "").replace("{outranked}", "")
    else:
        text = text.replace("{window}", f"{window},\n     ")
        text = text.replace("{outranked}", f",\n       {query('claim_window_outranked')}")
    return text.replace("{type_filter}", type_filter(types))


def steal_sql(types: TypeFilter | None = None) -> str:
    """The stealing claim: other workers' buckets, in the order given by %(steal_buckets)s.
    The bucket order is a parameter, so the text changes only with the kind of type filter."""
    return _finish(query("claim_select_steal"), types)


def check_buckets(buckets: Sequence[int]) -> None:
    """Refuse a partitioned claim's bucket set that names no bucket, or one that does not exist."""
    if not buckets:
        raise ValueError("a partitioned claim needs at least one bucket")
    if any(not isinstance(b, int) or not 0 <= b < NUM_BUCKETS for b in buckets):
        raise ValueError(f"buckets must be integers in 0..{NUM_BUCKETS - 1}: {list(buckets)}")


def claim_sql(
    buckets: Sequence[int] | None, types: TypeFilter | None = None, *, window: bool = False
) -> str:
    """The claim statement for a mode: SKIP LOCKED (`buckets=None`) or partitioned over `buckets`,
    for every job type (`types=None`) or as `types` says (%(claim_types)s then holds them).
    `window`: `buckets` are a claim window, vetoed by a due job of better priority in the
    claimer's other buckets (%(outside)s; sql/claim.sql, claim_window).

    Buckets are validated integers inlined as literals, so each bucket set is one statement text
    that psycopg prepares once per connection; the set only changes on a rebalance.
    """
    if buckets is None:
        if window:
            raise ValueError("a claim window is a set of buckets")
        return _finish(query("claim_select_skip_locked"), types)
    check_buckets(buckets)
    ordered = sorted(set(buckets))
    if len(ordered) == NUM_BUCKETS and not window:
        return _finish(query("claim_select_all_buckets"), types)
    branch = query("claim_select_partitioned_branch")
    branches = "\nUNION ALL\n".join(branch.replace("{bucket}", str(b)) for b in ordered)
    if window:
        ctes = query("claim_window").replace("{bucket_branches}", branches)
        return _finish(query("claim_select_window"), types, ctes)
    return _finish(query("claim_select_partitioned").replace("{bucket_branches}", branches), types)


class ClaimTexts:
    """A store's claim statements, each built once per (bucket set, type filter, steal, window):
    the bucket set only changes on a rebalance, or from one claim window to the next."""

    def __init__(self) -> None:
        self._texts: dict[tuple[Any, ...], str] = {}

    def __call__(
        self,
        buckets: Sequence[int] | None,
        types: TypeFilter | None,
        *,
        steal: bool = False,
        window: bool = False,
    ) -> str:
        bucket_set = None if buckets is None else tuple(buckets)
        key = (bucket_set, None if types is None else types.include, steal, window)
        sql = self._texts.get(key)
        if sql is None:
            if len(self._texts) > 64:  # rebalances churn the set; keep the cache small
                self._texts.clear()
            sql = self._texts[key] = (
                steal_sql(types) if steal else claim_sql(bucket_set, types, window=window)
            )
        return sql


def claim_params(
    queue: str,
    limit: int,
    lease_s: float,
    worker: str,
    token: str,
    flow_version: int | None,
    types: TypeFilter | None,
    outside: Sequence[int] | None = None,
) -> dict[str, Any]:
    """A claim's parameters; `outside`: a claim window's (claim_sql(window=True)), the claimer's
    other buckets."""
    params: dict[str, Any] = {
        "queue": queue,
        "limit": limit,
        "lease_s": lease_s,
        "worker": worker,
        "token": token,
        "flow_version": flow_version,
    }
    if types is not None:
        params["claim_types"] = list(types.types)
    if outside is not None:
        check_buckets(outside)
        params["outside"] = int_array(outside)
    return params


def allowance(
    rows: Sequence[tuple[int | None, int, float | None]],
) -> tuple[int | None, str | None]:
    """How many jobs a gated claim may start now under its locked limit rows, given as (max_running,
    running now, tokens now): None if no row bounds it. Also which kind of limit binds tightest."""
    allowed: int | None = None
    held_by: str | None = None
    for max_running, running, tokens in rows:
        if max_running is not None:
            free = max(0, max_running - running)
            if allowed is None or free < allowed:
                allowed, held_by = free, "max_running"
        if tokens is not None:
            whole = max(0, math.floor(tokens + 1e-9))
            if allowed is None or whole < allowed:
                allowed, held_by = whole, "per_second"
    return allowed, held_by


def next_token_s(tokens: float, spent: int, per_second: float) -> float:
    """Seconds until a rate-limited row has one whole token again, after `spent` of its `tokens`."""
    left = tokens - spent
    return max(0.0, (1.0 - left) / per_second) if left < 1.0 else 0.0
