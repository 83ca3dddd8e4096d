"""Job types that no live worker serves, with the jobs that wait for one and those discarded for
it (runtime/unserved.py): a part of `dispatcher status` and of the dashboard's workers page. A
rollout's new type shows here until its first pod is live; a typo in a job type shows for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.constants import UNSERVED_DISCARD_PREFIX
from dispatcher.db import rows
from dispatcher.db.queries import query


@dataclass(frozen=True, slots=True)
class UnservedType:
    queue: str
    job_type: str
    waiting: int  # queued, due or not
    discarded: int  # discarded because no worker served the type


def read_unserved(conn: psycopg.Connection[Any]) -> list[UnservedType]:
    """In `conn`'s transaction: the (queue, type) pairs with queued or so-discarded jobs that no
    live worker of the registry serves."""
    served = {(queue, job_type) for queue, job_type in conn.execute(query("presence_served_pairs"))}
    counted = rows.typed(
        UnservedType,
        conn.execute(
            query("jobs_waiting_or_discarded_by_type"),
            {"discarded_prefix": UNSERVED_DISCARD_PREFIX},
        ),
    )
    return sorted(
        (u for u in counted if (u.queue, u.job_type) not in served and (u.waiting or u.discarded)),
        key=lambda u: (u.queue, u.job_type),
    )


def render_unserved(unserved: Sequence[UnservedType]) -> list[str]:
    if not unserved:
        return []
    lines = ["job types no live worker serves (a rollout under way, or a job type nobody handles):"]
    lines += [
        f"  {u.queue}/{u.job_type}: {u.waiting} waiting, {u.discarded} discarded as unserved"
        for u in unserved
    ]
    return lines
