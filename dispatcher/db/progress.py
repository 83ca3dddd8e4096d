"""The store's write of what running handlers reported: jobs_report_progress (sql/progress.sql),
one statement for a batch of jobs, fenced by each job's claim token; on a distributed jobs table
(Citus), one statement per bucket, pinned to it as the other owner writes are (sharded.py).

`ProgressReport` is a batch's row: the JSON arrives already checked and serialised by the
handler's call (dispatcher/job_reports.py), so nothing here can fail on a value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import psycopg

from dispatcher.db import rows
from dispatcher.db.literals import int_array, token_array
from dispatcher.db.queries import query
from dispatcher.db.sharded import ShardedStatements, by_bucket, pinned
from dispatcher.job_reports import STORED_META_BYTES

Execute = Callable[[str, str, dict[str, Any]], Awaitable[psycopg.AsyncCursor[Any]]]


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """One running job's reports since the last write, under its claim's token. `progress`: the
    latest value as JSON text (None: none reported); `meta`: a JSON object of the updates to
    merge into its meta (None: none). `bucket`: the job's, which a distributed table routes by."""

    id: int
    token: str
    bucket: int
    progress: str | None
    meta: str | None


@dataclass(frozen=True, slots=True)
class ProgressWritten:
    """A job whose reports were written (the others were fenced: not running under that token).
    `meta_refused`: its meta updates were not merged, the stored meta would have grown past
    STORED_META_BYTES (its progress was written)."""

    id: int
    meta_refused: bool


async def report_progress(
    execute: Execute, sharded: ShardedStatements | None, reports: Sequence[ProgressReport]
) -> list[ProgressWritten]:
    """Write `reports` where each job still runs under its token; the rows written."""
    if not reports:
        return []
    if sharded is None:
        cur = await execute("progress", query("jobs_report_progress"), _params(reports))
        return rows.typed(ProgressWritten, await cur.fetchall())
    text = _pinned()
    written: list[ProgressWritten] = []
    for bucket, at in by_bucket([r.bucket for r in reports]).items():
        params = {**_params([reports[i] for i in at]), "bucket": bucket}
        cur = await execute("progress", text, params)
        written.extend(rows.typed(ProgressWritten, await cur.fetchall()))
    return written


@cache
def _pinned() -> str:
    return pinned(query("jobs_report_progress"))


def _params(reports: Sequence[ProgressReport]) -> dict[str, Any]:
    return {
        "ids": int_array([r.id for r in reports]),
        "tokens": token_array([r.token for r in reports]),
        "progress": [r.progress for r in reports],
        "meta": [r.meta for r in reports],
        "meta_bytes": STORED_META_BYTES,
    }
