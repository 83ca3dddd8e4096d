"""Handing back jobs a worker has no handler for (jobs_hand_back_owned, sql/finish.sql).

A rollout that adds a job type runs old pods beside new ones, and an old pod claims the new type's
jobs: it hands them back, their attempt not spent and their ordering key kept, to run on a worker
that serves the type; a type nobody has served for the unserved window is discarded. Rare by
nature, so one statement per bucket, sent through the store's bounded `run` (on a Citus cluster
pinned to the bucket, whose owners it wakes for the keys it released).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db import rows
from dispatcher.db.literals import int_array, token_array
from dispatcher.db.queries import query
from dispatcher.db.sharded import by_bucket, pinned
from dispatcher.db.store import JobStore
from dispatcher.model import Job


@dataclass(frozen=True, slots=True)
class HandBack:
    """A claimed job handed back: due again in `delay_s`; discarded with `error` instead if
    `unserved` (no worker served its type within the window) and the job is older than that."""

    job: Job
    delay_s: float
    unserved: bool
    error: str


@dataclass(frozen=True, slots=True)
class HandedBack:
    """A row jobs_hand_back_owned wrote (fenced ones are absent): queued, discarded or cancelled."""

    id: int
    status: str
    queue: str
    job_type: str
    promoted: int | None


async def hand_back(
    store: JobStore, backs: Sequence[HandBack], window_s: float
) -> list[HandedBack]:
    """Write `backs` where each one's token still matches; the rows written."""
    await store.connection()  # reads the table's placement
    sharded = store.sharded
    text = query("jobs_hand_back_owned")
    groups = {-1: list(range(len(backs)))}  # one node: one statement for all
    if sharded is not None:  # a cluster: one statement per bucket, pinned to it
        text, groups = pinned(text), by_bucket([b.job.bucket for b in backs])
    written: list[HandedBack] = []
    for bucket, at in groups.items():
        some = [backs[i] for i in at]
        params: dict[str, Any] = {
            "ids": int_array([b.job.id for b in some]),
            "tokens": token_array([b.job.token for b in some]),
            "delays_s": [b.delay_s for b in some],
            "unserved": [b.unserved for b in some],
            "errors": [b.error for b in some],
            "window_s": window_s,
            "channel": NOTIFY_CHANNEL,
            "bucket": bucket,
        }

        async def work(conn: psycopg.AsyncConnection[Any], p: dict[str, Any] = params) -> Any:
            return await (await conn.execute(text, p)).fetchall()

        got = rows.typed(HandedBack, await store.run("hand back", work))
        written += got
        if sharded is not None and any(h.promoted for h in got):
            await sharded.wake(bucket, sorted({h.queue for h in got}))
    return written
