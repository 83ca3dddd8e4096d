"""Bulk enqueue's COPY rows, and how the staged rows are published into the jobs table.

COPY's text format is built here by hand (~1 us a row) because psycopg's row-by-row writer is
several times slower; `dispatcher.api.enqueue` streams these chunks into the jobs table, or into
the staging table when dedupe or ordering keys need a statement to choose each row's fate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb

from dispatcher.constants import DEFAULT_MAX_ATTEMPTS
from dispatcher.db import rows
from dispatcher.db.literals import tag_array
from dispatcher.db.port import NewJob
from dispatcher.db.queries import query
from dispatcher.observe import tracing

COPY_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}
COPY_CHUNK_ROWS = 5000  # stream in chunks: the server parses one while we build the next
# max_attempts, max_attempts_given of a job not given one
_NOT_GIVEN = b"%d\tf" % DEFAULT_MAX_ATTEMPTS
_NO_TAGS = b"\t\\N"  # the tags column of a job without tags: NULL


def copy_text(value: str) -> bytes:
    """A text value in COPY's text format (backslash, tab, newline and CR escaped)."""
    return value.translate(COPY_ESCAPES).encode()


@dataclass(slots=True)
class CopyTally:
    rows: int = 0
    queues: set[str] = field(default_factory=set)
    # a staged row has an ordering key: publish through jobs_stage_publish_keyed
    keyed: bool = False
    # a staged row has a dedupe window: publish between sql/dedupe.sql's steps
    windowed: bool = False
    # the enqueuing span's trace context (copy_plan), for every row
    trace: dict[str, str] | None = None


def copy_chunks(
    prepared: Iterable[NewJob],
    db_now: datetime,
    tally: CopyTally,
    staged: bool = False,
    trace: bytes | None = None,
) -> Iterator[bytes]:
    """COPY text-format lines, ~1 us a row: the server's ~9 us per row stays the bottleneck.

    run_at is the database's now() (read in the same transaction) plus the job's delay, so the
    database clock still rules. Names were validated against a pattern with no escapes needed.
    The staging table (`staged`) also takes each row's ordering key and dedupe window; then come
    the tags (\\N: none; one literal per tuple of tags, built once); `trace` (copy_plan's) ends
    every row with the enqueuing span's trace context.
    """
    now_text = db_now.isoformat().encode()
    end = b"\n" if trace is None else b"\t" + trace + b"\n"
    names: dict[tuple[str, str], bytes] = {}
    tag_texts: dict[tuple[str, ...], bytes] = {}
    lines: list[bytes] = []
    for p in prepared:
        prefix = names.get((p.queue, p.job_type))
        if prefix is None:
            prefix = names[(p.queue, p.job_type)] = f"{p.queue}\t{p.job_type}\t".encode()
            tally.queues.add(p.queue)
        payload = p.payload.replace(b"\\", b"\\\\") if b"\\" in p.payload else p.payload
        if p.run_at is None and not p.delay_s:
            run_at = now_text
        else:
            run_at = ((p.run_at or db_now) + timedelta(seconds=p.delay_s)).isoformat().encode()
        dedupe = b"\\N" if p.dedupe_key is None else copy_text(p.dedupe_key)
        if staged:
            dedupe += b"\t\\N" if p.ordering_key is None else b"\t" + copy_text(p.ordering_key)
            tally.keyed = tally.keyed or p.ordering_key is not None
            if p.dedupe_window_s is None:
                dedupe += b"\t\\N"
            else:
                dedupe += b"\t%r" % p.dedupe_window_s
                tally.windowed = True
        tags = _NO_TAGS if p.tags is None else tag_texts.get(p.tags) or _tags(tag_texts, p.tags)
        if staged:  # the staging table keeps NULL for "not given" (published as 20, not given)
            attempts = b"\\N" if p.max_attempts is None else b"%d" % p.max_attempts
        # max_attempts, max_attempts_given: 20 for workers of the previous release, else the
        # handler's
        else:
            attempts = _NOT_GIVEN if p.max_attempts is None else b"%d\tt" % p.max_attempts
        lines.append(
            b"%s%s\t%d\t%d\t%s\t%s\t%s%s%s"
            % (prefix, payload, p.priority, p.bucket, attempts, run_at, dedupe, tags, end)
        )
        if len(lines) >= COPY_CHUNK_ROWS:
            tally.rows += len(lines)
            yield b"".join(lines)
            lines = []
    if lines:
        tally.rows += len(lines)
        yield b"".join(lines)


def _tags(texts: dict[tuple[str, ...], bytes], tags: tuple[str, ...]) -> bytes:
    """The tags column of a row with these tags, built once per batch and kept in `texts`."""
    text = texts[tags] = b"\t" + str(tag_array(tags)).encode()
    return text


def copy_plan(staged: bool, tally: CopyTally) -> tuple[str, bytes | None]:
    """The COPY statement, straight into the table or through the staging table when dedupe or
    ordering keys need ON CONFLICT; and, for the former inside an OpenTelemetry span, the trace
    context every row carries (copy_chunks). The staged rows get it when they are published
    (`tally.trace`, a parameter of the publish statements)."""
    tally.trace = tracing.carrier()
    if staged:
        return query("jobs_stage_copy_in"), None
    if tally.trace is None:
        return query("jobs_copy_in"), None
    return query("jobs_copy_in_traced"), copy_text(orjson.dumps(tally.trace).decode())


def publish_statement(tally: CopyTally) -> str:
    return query("jobs_stage_publish_keyed" if tally.keyed else "jobs_stage_publish")


def _publish_params(tally: CopyTally) -> dict[str, Any]:
    return {"trace_context": None if tally.trace is None else Jsonb(tally.trace)}


async def published_async(cur: psycopg.AsyncCursor[Any], tally: CopyTally) -> int:
    """Move the staged rows into the jobs table; how many went in (live duplicates are skipped)."""
    cur = await cur.execute(publish_statement(tally), _publish_params(tally))
    return int(rows.value(await cur.fetchone())) if tally.keyed else cur.rowcount


def published_sync(cur: psycopg.Cursor[Any], tally: CopyTally) -> int:
    cur = cur.execute(publish_statement(tally), _publish_params(tally))
    return int(rows.value(cur.fetchone())) if tally.keyed else cur.rowcount


def owns_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a bulk enqueue runs in a transaction of its own: only on an autocommit connection
    outside any transaction block. Otherwise the jobs belong to the caller's transaction, begun or
    not yet (a connection outside autocommit that has sent nothing yet, as inside Django's
    `transaction.atomic`; an autocommit one inside `conn.transaction()`): they commit with it or
    not at all, and the statistics after a bulk load are the caller's to refresh."""
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def unbegun(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """A connection outside autocommit whose transaction has not begun: psycopg would make
    `conn.transaction()` a transaction of its own there and COMMIT it, the caller's rollback
    notwithstanding. A first statement begins the caller's instead, and `transaction()` then
    nests in it as a savepoint."""
    return not conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
