"""Where PostgreSQL's time goes, per statement (`--statements`): pg_stat_statements deltas over a
run.

The throwaway server is started with pg_stat_statements preloaded; against a server of your own
the extension must be preloaded there (`shared_preload_libraries`) or the option says it is not
available. Each statement is named after its named query (dispatcher/db/sql, coordinator/sql, and
the bench's own minimal table, bench/sql), recognised by the start of its text; the rest keep
their first words. Figures are per job of the run: calls, execution time in µs
(`total_exec_time`, the server's own clock, so it includes lock waits and waiting for a core),
and shared buffers touched (hit or read: pages, a proxy for the index entries and rows a
statement walked).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import psycopg

from coordinator.pg.sqlfile import load_all
from dispatcher.db import (
    COMPLETED_ARCHIVE,
    COMPLETED_DELETE,
    COMPLETED_KEEP,
    completion_statements,
    query,
)

# The claim's variants share one statement shape: told apart by their selection.
CLAIM_KINDS = (
    ("claim (window)", "outranked"),  # before steal's: its veto unnests the other buckets
    ("claim (steal)", "unnest"),
    ("claim (skip_locked)", "SKIP LOCKED"),
    ("claim (partitioned)", "UNION ALL"),
    ("claim (all buckets)", ""),
)
_STRING = re.compile(r"'(?:[^']|'')*'|%\(\w+\)s")
_COMMENT = re.compile(r"--[^\n]*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
# extract(epoch FROM ...): a constant
_EXTRACT_FIELD = re.compile(r"\bextract\s*\(\s*[A-Za-z_]+", re.IGNORECASE)
_CONSTANT_WORDS = {"NULL", "TRUE", "FALSE"}  # constants too, to pg_stat_statements


def _normal(text: str) -> str:
    """The statement's words only: pg_stat_statements replaces every constant (strings, numbers,
    NULL, true, false, and extract()'s field) by $n, psycopg every %(name)s parameter; the words
    are what both keep."""
    words = _WORD.findall(_STRING.sub(" ", _EXTRACT_FIELD.sub("extract(", _COMMENT.sub("", text))))
    return " ".join(w for w in words if w.upper() not in _CONSTANT_WORDS)


@functools.cache
def _named() -> dict[str, str]:
    """A named query's words -> its name, for every named query of both packages and the bench's."""
    named = {}
    for package in ("coordinator", "dispatcher.db", "bench"):
        for name, text in load_all(package).items():
            if package == "dispatcher.db":
                text = query(name)  # as sent: with its fragments ({promote_next}) filled in
            if "{completion}" in text:  # a completion's wrapper: named below, as the store sends it
                continue
            named.setdefault(_normal(text), name)
    # The completions a worker sends (dispatcher/db/completions.py): fenced, keyed, and under
    # DISPATCHER_COMPLETED_JOBS=delete and archive closing uniqueness windows; named by role.
    for completed, plain in (
        (COMPLETED_KEEP, "jobs_complete_owned"),
        (COMPLETED_DELETE, "jobs_complete_owned_delete"),
        (COMPLETED_ARCHIVE, "jobs_complete_owned_archive"),
    ):
        sent = completion_statements(completed)
        named.setdefault(_normal(sent[False]), plain)
        named.setdefault(_normal(sent[True]), f"{plain}_keyed")
    return named


RECORDING = {"on": False}  # set once by `python -m bench --statements`; read by runs.measured_run


@dataclass(frozen=True, slots=True)
class Usage:
    calls: int
    exec_ms: float
    rows: int
    blocks: int = 0  # shared buffers hit or read: pages touched, a proxy for index entries walked


def enable(dsn: str) -> None:
    """Create the extension (the server must preload the library) and record from now on;
    raises SystemExit with one line where the server cannot."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
    except psycopg.Error as exc:
        raise SystemExit(
            f"bench: --statements needs pg_stat_statements in shared_preload_libraries: "
            f"{str(exc).strip().splitlines()[0]}"
        ) from None
    RECORDING["on"] = True


def name_of(text: str) -> str:
    """Our query's name (dispatcher/db/sql, coordinator/sql, bench/sql), or the statement's first
    words."""
    normal = _normal(text)
    if normal.startswith(("WITH picked AS MATERIALIZED", "WITH win AS MATERIALIZED")):
        return next(kind for kind, fragment in CLAIM_KINDS if fragment in normal)
    return _named().get(normal) or " ".join(normal.split(" ")[:4])[:28]


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, Usage]:
    """Cumulative usage per statement name, this database only."""
    totals: dict[str, list[float]] = {}
    for text, *figures in conn.execute(
        """SELECT s.query, s.calls, s.total_exec_time, s.rows,
                  s.shared_blks_hit + s.shared_blks_read
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = current_database()"""
    ).fetchall():
        entry = totals.setdefault(name_of(text), [0, 0.0, 0, 0])
        for i, value in enumerate(figures):
            entry[i] += value
    return {
        name: Usage(int(c), float(ms), int(r), int(b)) for name, (c, ms, r, b) in totals.items()
    }


def minus(after: dict[str, Usage], before: dict[str, Usage]) -> dict[str, Usage]:
    """Usage between two snapshots, statements that ran in between only."""
    delta = {}
    for name, usage in after.items():
        was = before.get(name, Usage(0, 0.0, 0))
        if usage.calls > was.calls:
            delta[name] = Usage(
                usage.calls - was.calls,
                usage.exec_ms - was.exec_ms,
                usage.rows - was.rows,
                usage.blocks - was.blocks,
            )
    return delta


def per_job(delta: dict[str, Usage], jobs: int, top: int = 10) -> list[dict[str, Any]]:
    """The statements that took the most time in `delta` (minus()), per job of the run."""
    rows = [
        {
            "statement": name,
            "calls_per_1k_jobs": round(1000 * u.calls / jobs, 2),
            "exec_us_per_job": round(1000 * u.exec_ms / jobs, 2),
            "exec_ms_per_call": round(u.exec_ms / u.calls, 3),
            "blocks_per_job": round(u.blocks / jobs, 2),
        }
        for name, u in delta.items()
    ]
    rows.sort(key=lambda r: -r["exec_us_per_job"])
    return rows[:top]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"  {'statement':<28}{'calls/1k jobs':>15}{'exec us/job':>13}"
        f"{'ms/call':>10}{'blocks/job':>12}"
    ]
    lines += [
        f"  {r['statement'][:27]:<28}{r['calls_per_1k_jobs']:>15.2f}{r['exec_us_per_job']:>13.2f}"
        f"{r['exec_ms_per_call']:>10.3f}{r.get('blocks_per_job', 0):>12.2f}"
        for r in rows
    ]
    return "\n".join(lines)
