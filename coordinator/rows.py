"""The typed rows of the PostgreSQL coordinator's statements (coordinator/sql/), built in one place.

The backend (backend_pg.py) reads its results only through these builders, so no other module
knows a statement's column order. The same pattern as dispatcher/db/rows.py, which coordinator/
does not import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backend import BucketState, ClusterView


def first_flag(rows: Sequence[Sequence[Any]]) -> bool:
    """A one-row, one-boolean result (member_lock: the lock was taken; member_heartbeat: the
    member (re)joined): False if no row came back."""
    return bool(rows) and bool(rows[0][0])


def cluster_view(rows: Sequence[Sequence[Any]]) -> ClusterView:
    """cluster_view's rows, one per bucket (bucket, owner, next_owner, epoch, revoke_overdue),
    each with the group's live members, its leader and the next expiry (seconds)."""
    _, _, _, _, _, members, leader, next_expiry_s = rows[0]
    return ClusterView(
        members=tuple(members),
        buckets=tuple(
            BucketState(bucket, owner, next_owner, epoch, bool(revoke_overdue))
            for bucket, owner, next_owner, epoch, revoke_overdue, *_ in rows
        ),
        leader=leader,
        next_expiry_s=next_expiry_s,
    )
