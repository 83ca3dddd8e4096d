"""`drain`'s minimal table: the physical limit every drain result states its ratio to.

A table of three columns and one partial index on the queued rows (bench/sql/minimal.sql), filled
with the drain's number of jobs and drained as the ceiling drains ours: W processes, each claiming
500 on one connection while a second completes the previous batch, by UPDATE (`minimal`) or by
DELETE (`minimal_delete`). How it is timed and measured: docs/design/bench-method.md.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import psycopg

from bench.core import clocked_pair, reset, run_processes
from coordinator.pg.sqlfile import load
from dispatcher.db import int_array

BATCH = 500  # as the ceiling's claims and the bench's runtime (concurrency 500, batch 500)
KINDS = {"minimal": "minimal_complete", "minimal_delete": "minimal_complete_delete"}
MODE = "-"  # no mode of ours: a minimal row stands beside both modes' rows at its worker count


def minimal_query(name: str) -> str:
    """A statement of bench/sql/minimal.sql."""
    return load("bench", "minimal.sql")[name]


def fill(conn: psycopg.Connection[Any], jobs: int) -> None:
    """A fresh minimal table of `jobs` queued jobs, analyzed; dispatcher_jobs emptied, so that no
    autovacuum of the previous run's completed rows lands in this one."""
    reset(conn)
    for name in ("minimal_drop", "minimal_create", "minimal_index"):
        conn.execute(minimal_query(name))
    conn.execute(minimal_query("minimal_fill"), {"jobs": jobs})
    conn.execute(minimal_query("minimal_analyze"))


async def _drainer(dsn: str, complete: str) -> tuple[datetime, datetime]:
    """Claim and complete until nothing is left; (database clock before the first claim, after
    the last completion)."""
    claim_sql, complete_sql = minimal_query("minimal_claim"), minimal_query(complete)
    batches: asyncio.Queue[list[int] | None] = asyncio.Queue(maxsize=2)

    async def claimer(conn: psycopg.AsyncConnection[Any]) -> None:
        while rows := await (await conn.execute(claim_sql, {"limit": BATCH})).fetchall():
            await batches.put([r[0] for r in rows])
        await batches.put(None)

    async def completer(conn: psycopg.AsyncConnection[Any]) -> None:
        while (ids := await batches.get()) is not None:
            await conn.execute(complete_sql, {"ids": int_array(ids)})

    return await clocked_pair(dsn, claimer, completer)  # type: ignore[no-any-return]


def drainer(dsn: str, complete: str) -> tuple[float, datetime, datetime]:
    """One drainer process: (its CPU seconds, database clock at its start and end)."""
    started = time.process_time()
    first, last = asyncio.run(_drainer(dsn, complete))
    return time.process_time() - started, first, last


def drain(dsn: str, kind: str, workers: int) -> tuple[float, float]:
    """Drain the table with `workers` processes: (their CPU seconds in all, the drain's seconds
    from the first drainer's start to the last one's end, on the database clock)."""
    ran = run_processes(drainer, [(dsn, KINDS[kind])] * workers)
    seconds = (max(end for _, _, end in ran) - min(start for _, start, _ in ran)).total_seconds()
    return sum(cpu for cpu, _, _ in ran), seconds


def finish(conn: psycopg.Connection[Any], kind: str) -> int:
    """After a drain: the claim-index entries it read; checks that every job was completed, then
    drops the table (a server of your own, --dsn, keeps nothing of it)."""
    idx_read = int(conn.execute(minimal_query("minimal_index_reads")).fetchone()[0])  # type: ignore[index]
    left = int(conn.execute(minimal_query("minimal_not_done")).fetchone()[0])  # type: ignore[index]
    assert left == 0, f"{kind} drain left {left} jobs behind"
    conn.execute(minimal_query("minimal_drop"))
    return idx_read
