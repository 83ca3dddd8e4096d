"""`drain`'s minimal table: the physical limit every drain result states its ratio to.

A table of three columns and one partial index on the queued rows (bench/sql/minimal.sql),
filled with the same number of jobs as the runtime's drain and drained the way the plain-SQL
ceiling drains ours (bench/drain.py): W processes, each claiming 500 at a time on one connection
while a second completes the previous batch. Two kinds: `minimal` completes by UPDATE,
`minimal_delete` by DELETE (the completion that deletes, measured against its own limit).

Measured as the ceiling is: jobs/s over the drain on the database clock, claim-index entries
read, and the CPU of PostgreSQL and of the drainer processes. The table has no timestamps, so
each drainer reads the clock before its first claim and after its last completion: the window
also holds that completion's execution and commit (a few ms), which the ceiling's, closed at its
last completion's now(), does not.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import psycopg

from bench.core import reset, run_processes
from coordinator.pg.sqlfile import load
from dispatcher.db import int_array
from dispatcher.devtools.harness import measure_query

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

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c1, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c2:
        clock = measure_query("measure_clock")
        started = (await (await c1.execute(clock)).fetchone())[0]  # type: ignore[index]
        await asyncio.gather(claimer(c1), completer(c2))
        ended = (await (await c2.execute(clock)).fetchone())[0]  # type: ignore[index]
    return started, ended


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
