"""What the database shows of a worker fleet that runs elsewhere (pods, or processes started apart):
how many live workers, and which mode each claims in. How they are recognised:
docs/design/bench-method.md.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

from dispatcher.db import NUM_BUCKETS, claim_sql, query
from dispatcher.devtools.harness import lock_waiters

CLAIM_APPLICATION = "dispatcher-claim"  # worker.py: f"dispatcher-{role}" for the claim store
PARTITIONED, SKIP_LOCKED = "partitioned", "skip_locked"


def server_text(sql: str) -> str:
    """A statement as PostgreSQL receives it from psycopg: named placeholders become $1, $2, ...
    in the order they first appear (the same name keeps its number), %% becomes %."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match[0] == "%%":
            return "%"
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    return re.sub(r"%%|%\((\w+)\)s", number, sql)


_CLAIM_HEAD = server_text(query("jobs_claim").replace("{window}", "").split("{select_ids}")[0])
# A claim window's statement (partitioned) starts with the window's CTEs (claim_window), up to its
# first bucket.
_WINDOWS = [server_text(claim_sql(buckets, window=True)) for buckets in ((0, 1), (2, 3))]
_WINDOW_HEAD = _WINDOWS[0][
    : next(i for i, (a, b) in enumerate(zip(*_WINDOWS, strict=False)) if a != b)
]
_SKIP_LOCKED_CLAIM = server_text(claim_sql(None))
_ALL_BUCKETS_CLAIM = server_text(claim_sql(range(NUM_BUCKETS)))
# The longest prefix the SKIP LOCKED claim shares with a partitioned one (they differ only once the
# SKIP LOCKED claim's `FOR UPDATE SKIP LOCKED` begins): a text cut shorter than this (a small
# track_activity_query_size) cannot tell them apart.
_SHARED = next(
    i
    for i, (a, b) in enumerate(zip(_SKIP_LOCKED_CLAIM, _ALL_BUCKETS_CLAIM, strict=False))
    if a != b
)


def claim_mode(text: str | None) -> str | None:
    """partitioned or skip_locked for a claim statement's text (as pg_stat_activity shows it,
    possibly cut at track_activity_query_size); None for anything else, a hidden text
    ('<insufficient privilege>') or one cut too short to tell."""
    if text and text.startswith(_WINDOW_HEAD):
        return PARTITIONED
    if not text or not text.startswith(_CLAIM_HEAD):
        return None
    if _SKIP_LOCKED_CLAIM.startswith(text):
        return SKIP_LOCKED if len(text) > _SHARED else None
    return PARTITIONED


def claim_sessions(conn: psycopg.Connection[Any]) -> dict[int, str | None]:
    """pid -> last statement of every worker's claim session on this database (one per process)."""
    rows = conn.execute(
        "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = %s",
        (CLAIM_APPLICATION,),
    ).fetchall()
    return {int(pid): text for pid, text in rows}


def live_members(conn: psycopg.Connection[Any], queue: str) -> int:
    """Live members of `queue`'s coordination group (the PostgreSQL coordinator's table)."""
    row = conn.execute(
        "SELECT count(*) FROM dispatcher_members WHERE queue = %s AND expires_at > now() "
        "AND NOT leaving",
        (queue,),
    ).fetchone()
    return int(row[0]) if row else 0


class FleetSampler:
    """Sampled while a run goes on: the most lock waiters seen at once, and the mode of each
    worker's claim session (its last classified claim: idle sessions show other statements too)."""

    def __init__(self) -> None:
        self.max_lock_waiters = 0
        self.mode_of: dict[int, str] = {}
        self.sessions: set[int] = set()

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        self.max_lock_waiters = max(self.max_lock_waiters, lock_waiters(conn))
        for pid, text in claim_sessions(conn).items():
            self.sessions.add(pid)
            mode = claim_mode(text)
            if mode is not None:
                self.mode_of[pid] = mode

    def modes(self) -> dict[str, int]:
        """mode -> worker processes seen claiming that way; 'unknown' for the claim sessions whose
        statements never showed a claim (hidden text, or idle throughout)."""
        counts: dict[str, int] = {}
        for mode in self.mode_of.values():
            counts[mode] = counts.get(mode, 0) + 1
        unknown = len(self.sessions - self.mode_of.keys())
        if unknown:
            counts["unknown"] = unknown
        return dict(sorted(counts.items()))

    def mode(self) -> str:
        """The fleet's one mode, 'mixed' during a switch (both seen), 'unknown' if none seen."""
        seen = set(self.mode_of.values())
        return seen.pop() if len(seen) == 1 else ("mixed" if seen else "unknown")
