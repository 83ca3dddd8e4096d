"""What each dashboard page shows, read from the database: sync functions on one idle connection
of the dashboard's pool, each view in one bounded transaction (db/oneshot.py). The job admin,
flow control and schedules come from dispatcher.admin, the fleet from `dispatcher status`'s reads,
so the dashboard and the CLI never disagree. Typed results; the templates only format them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.fleet_status import RegisteredWorker, read_fleet, read_registry
from dispatcher.api.flow import PausedQueue
from dispatcher.api.unserved_types import UnservedType, read_unserved
from dispatcher.constants import NUM_BUCKETS
from dispatcher.db import rows
from dispatcher.db.citus import distributed_sync
from dispatcher.db.oneshot import bounded_transaction
from dispatcher.db.queries import query
from dispatcher.db.rows import QueueDepth

READ_BUDGET = 2.0  # a page's statements may take statement_timeout_s x this (10 s at the defaults)
OUTCOME_WINDOW_S = 60  # throughput: jobs finished in the last minute
BACKLOG_CAP = 10_000  # a bucket's due count stops here on the map ("10000+"): bounds the index read
COLOURS = 12  # owner colours on the bucket map (CSS classes o0..o11)
GONE_SHOWN = 50  # workers gone within the hour listed on the workers page (rollouts make many)
# The per-queue columns of the overview, in the order shown (queue_depth's statuses).
DEPTH_STATUSES = (
    "queued",
    "scheduled",
    "running",
    "waiting",
    "failed",
    "discarded",
    "cancelled",
    "halted",
)


@dataclass(frozen=True, slots=True)
class QueueSummary:
    name: str
    counts: dict[str, int]  # DEPTH_STATUSES -> jobs ("queued": due now; "halted": ordering keys)
    oldest_due_age_s: float | None
    completed_per_min: int  # in the last OUTCOME_WINDOW_S
    failed_per_min: int
    paused: bool
    workers: int  # live workers serving it (the worker registry: every mode and coordinator)


@dataclass(frozen=True, slots=True)
class Overview:
    queues: list[QueueSummary]
    mode: str  # as this dashboard's settings say (the workers' ConfigMap, in Kubernetes)
    coordinator: str
    # False under DISPATCHER_COMPLETED_JOBS=delete: no completed rows to count
    completed_rows_kept: bool


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    heartbeat_age_s: float
    up_s: float
    leaving: bool
    leader: bool
    buckets: list[int]
    degraded: bool  # leaving, or its heartbeat is late by more than half a membership lease
    colour: int  # its class on the bucket map


@dataclass(frozen=True, slots=True)
class Group:
    """One coordination group (a queue) as the PostgreSQL coordinator's tables have it."""

    name: str
    leader: str | None
    term: int | None
    members: list[Member]
    unowned: list[int]
    handoffs: list[dict[str, Any]]  # {bucket, from, to}
    orphaned: list[dict[str, Any]]  # {bucket, owner}: its owner is no longer a live member


@dataclass(frozen=True, slots=True)
class Fleet:
    """The workers page: the worker registry, and the PostgreSQL coordinator's groups."""

    live: list[RegisteredWorker]  # every live worker, whatever its mode and coordinator
    gone: list[RegisteredWorker]  # stopped or vanished within the hour, last seen first
    gone_more: int  # gone ones beyond GONE_SHOWN, not listed
    groups: list[Group]
    unserved: list[UnservedType]  # job types with jobs that no live worker serves


@dataclass(frozen=True, slots=True)
class Cell:
    bucket: int
    due: int
    capped: bool  # due reached BACKLOG_CAP: there are at least that many
    owner: str | None
    colour: int | None  # None: no live owner
    next_owner: str | None  # a hand-off in progress


@dataclass(frozen=True, slots=True)
class BucketMap:
    queue: str
    cells: list[Cell]
    # None: no PostgreSQL-coordinated worker serves it (skip_locked, Redis, static)
    group: Group | None
    due_total: int
    capped: bool = False
    owners: list[Member] = field(default_factory=list)


def overview(
    conn: psycopg.Connection[Any],
    limits: ConnectionLimits,
    *,
    mode: str,
    coordinator: str,
    completed_rows_kept: bool,
) -> Overview:
    with bounded_transaction(conn, "dashboard overview", limits, budget=READ_BUDGET):
        conn.execute(query("web_serial_reads"), prepare=False)
        depth: dict[str, dict[str, int]] = {}
        oldest: dict[str, float | None] = {}
        for d in rows.typed(QueueDepth, conn.execute(query("queue_depth"), prepare=False)):
            depth.setdefault(d.queue, dict.fromkeys(DEPTH_STATUSES, 0))[d.status] = int(d.jobs)
            if d.status == "queued":
                oldest[d.queue] = d.oldest_due_age_s if d.jobs else None
        recent = conn.execute(
            query("web_recent_outcomes"), {"window_s": OUTCOME_WINDOW_S}, prepare=False
        )
        outcomes = {
            r.queue: (int(r.completed), int(r.failed))
            for r in rows.typed(rows.RecentOutcomes, recent)
        }
        paused_rows = conn.execute(query("flow_paused_list"), prepare=False)
        paused = {p.queue for p in rows.typed(PausedQueue, paused_rows)}
        members: dict[str, int] = {}
        for w in read_registry(conn).live:
            for q in w.queues:
                members[q] = members.get(q, 0) + 1
    names = sorted(set(depth) | set(outcomes) | paused | set(members))
    queues = [
        QueueSummary(
            q,
            depth.get(q, dict.fromkeys(DEPTH_STATUSES, 0)),
            oldest.get(q),
            outcomes.get(q, (0, 0))[0],
            outcomes.get(q, (0, 0))[1],
            q in paused,
            members.get(q, 0),
        )
        for q in names
    ]
    return Overview(queues, mode, coordinator, completed_rows_kept)


def queue_names(conn: psycopg.Connection[Any], limits: ConnectionLimits) -> list[str]:
    """The queues with queued jobs or a coordination group (the bucket map's choice)."""
    with bounded_transaction(conn, "dashboard queues", limits, budget=READ_BUDGET):
        if not distributed_sync(conn):
            return rows.values(conn.execute(query("web_queue_names"), prepare=False))
        # A distributed table (Citus): the skip scan bucket by bucket, one router query each.
        names = set(rows.values(conn.execute(query("sharded_owned_queues"), prepare=False)))
        for bucket in range(NUM_BUCKETS):
            params = {"bucket": bucket}
            found = conn.execute(query("sharded_queue_names_in_bucket"), params, prepare=False)
            names.update(rows.values(found))
        return sorted(names)


def fleet(
    conn: psycopg.Connection[Any], limits: ConnectionLimits, *, member_lease_s: float
) -> Fleet:
    with bounded_transaction(conn, "dashboard workers", limits, budget=READ_BUDGET):
        registry = read_registry(conn)
        groups = _groups(read_fleet(conn), member_lease_s)
        unserved = read_unserved(conn)
    gone = registry.gone
    return Fleet(registry.live, gone[:GONE_SHOWN], max(0, len(gone) - GONE_SHOWN), groups, unserved)


def _backlog(conn: psycopg.Connection[Any], queue: str) -> dict[int, int]:
    """Each bucket's due jobs of `queue`, counted up to BACKLOG_CAP (on a distributed table, one
    router query per bucket: Citus refuses web_bucket_backlog's correlated subquery)."""
    params = {"queue": queue, "cap": BACKLOG_CAP}
    if not distributed_sync(conn):
        return rows.pairs(conn.execute(query("web_bucket_backlog"), params, prepare=False))
    due: dict[int, int] = {}
    for bucket in range(NUM_BUCKETS):
        found = conn.execute(
            query("sharded_bucket_backlog"), {**params, "bucket": bucket}, prepare=False
        )
        due[bucket] = int(rows.value(found.fetchone()))
    return due


def bucket_map(
    conn: psycopg.Connection[Any], limits: ConnectionLimits, queue: str, *, member_lease_s: float
) -> BucketMap:
    with bounded_transaction(conn, "dashboard buckets", limits, budget=READ_BUDGET):
        conn.execute(query("web_serial_reads"), prepare=False)
        due = _backlog(conn, queue)
        groups = {g.name: g for g in _groups(read_fleet(conn), member_lease_s)}
    group = groups.get(queue)
    owner_of: dict[int, Member] = {
        b: m for m in (group.members if group else []) for b in m.buckets
    }
    stale = {o["bucket"]: o["owner"] for o in (group.orphaned if group else [])}
    moving = {h["bucket"]: h["to"] for h in (group.handoffs if group else [])}
    cells = []
    for bucket in range(NUM_BUCKETS):
        member = owner_of.get(bucket)
        n = int(due.get(bucket, 0))
        cells.append(
            Cell(
                bucket,
                n,
                n >= BACKLOG_CAP,
                member.id if member else stale.get(bucket),
                member.colour if member else None,
                moving.get(bucket),
            )
        )
    return BucketMap(
        queue,
        cells,
        group,
        sum(c.due for c in cells),
        any(c.capped for c in cells),
        group.members if group else [],
    )


def _groups(raw: dict[str, Any], member_lease_s: float) -> list[Group]:
    groups = []
    for name, g in sorted(raw.items()):
        members = [
            Member(
                m["id"],
                m["heartbeat_age_s"],
                m["up_s"],
                m["leaving"],
                m["leader"],
                sorted(m["buckets"]),
                m["leaving"] or m["heartbeat_age_s"] > member_lease_s / 2,
                i % COLOURS,
            )
            for i, m in enumerate(g["members"])
        ]
        groups.append(
            Group(name, g["leader"], g["term"], members, g["unowned"], g["handoffs"], g["orphaned"])
        )
    return groups
