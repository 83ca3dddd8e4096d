"""The fleet part of `dispatcher status`, in text and as JSON: the worker registry (every worker,
whatever its mode and coordinator: dispatcher_workers, runtime/presence.py), then each coordination
group's live members, its leader and who owns which bucket (the PostgreSQL coordinator's tables).

Workers coordinated by Redis or with static buckets, and skip_locked ones, keep no rows in the
coordinator's tables: they show in the registry only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from dispatcher.api.text import age_text, bucket_ranges
from dispatcher.db import rows
from dispatcher.db.queries import query

GONE_WINDOW_S = 3600.0  # a worker stopped or vanished this recently is counted (and listed) as gone
# The columns of the registry's table in `dispatcher status`.
COLUMNS = (
    "worker",
    "host",
    "pid",
    "version",
    "mode",
    "coordinator",
    "queues",
    "running",
    "up",
    "heartbeat",
)


@dataclass(frozen=True, slots=True)
class RegisteredWorker:
    """presence_list: one worker of the registry, live or not (ages by the database clock)."""

    worker_id: str
    host: str
    pid: int
    version: str
    mode: str
    coordinator: str
    queues: list[str]
    job_types: list[str]
    concurrency: int
    running: int
    started_at: datetime
    seen_age_s: float  # since its last heartbeat
    up_s: float  # since its first heartbeat
    live: bool  # its lease runs and it has not stopped
    stopped_at: datetime | None  # a clean stop; None and not live: its lease ran out (killed)

    @property
    def vanished(self) -> bool:
        """Gone without saying so: killed, crashed or cut off from the database."""
        return not self.live and self.stopped_at is None


@dataclass(frozen=True, slots=True)
class WorkerRegistry:
    """The registry as read: the live workers, and those gone within GONE_WINDOW_S (last seen
    first)."""

    live: list[RegisteredWorker]
    gone: list[RegisteredWorker]


def read_registry(conn: psycopg.Connection[Any]) -> WorkerRegistry:
    """The worker registry, in `conn`'s transaction."""
    found = rows.typed(RegisteredWorker, conn.execute(query("presence_list"), prepare=False))
    gone = [w for w in found if not w.live and w.seen_age_s <= GONE_WINDOW_S]
    return WorkerRegistry(
        [w for w in found if w.live], sorted(gone, key=lambda w: (w.seen_age_s, w.worker_id))
    )


def worker_dict(w: RegisteredWorker) -> dict[str, Any]:
    """A worker as `dispatcher status --json` lists it."""
    return {
        "id": w.worker_id,
        "host": w.host,
        "pid": w.pid,
        "version": w.version,
        "mode": w.mode,
        "coordinator": w.coordinator,
        "queues": list(w.queues),
        "job_types": list(w.job_types),
        "running": w.running,
        "concurrency": w.concurrency,
        "started_at": w.started_at.isoformat(),
        "up_s": round(w.up_s, 1),
        "heartbeat_age_s": round(w.seen_age_s, 2),
    }


def render_registry(live: Sequence[dict[str, Any]], gone: int, vanished: int) -> list[str]:
    """The registry's part of `dispatcher status`: a line of counts, then a table of the live
    workers (`live`: worker_dict's)."""
    head = f"workers: {len(live)} live (the worker registry: every mode and coordinator)"
    if gone:
        head += (
            f"; {gone} gone within the hour ({gone - vanished} stopped, "
            f"{vanished} lease ran out: killed or cut off)"
        )
    if not live:
        return [head]
    table = [COLUMNS]
    for w in live:
        table.append(
            (
                w["id"],
                w["host"],
                str(w["pid"]),
                w["version"],
                w["mode"],
                w["coordinator"],
                ",".join(w["queues"]),
                f"{w['running']}/{w['concurrency']}",
                age_text(w["up_s"]),
                f"{w['heartbeat_age_s']:.1f}s",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    right = {COLUMNS.index(c) for c in ("pid", "running", "up", "heartbeat")}
    return [head] + [
        "  "
        + "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(r)
        ).rstrip()
        for r in table
    ]


def read_fleet(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """group -> {leader, term, members, unowned, handoffs, orphaned (buckets whose owner is no
    longer a live member)}, read in `conn`'s transaction."""
    groups: dict[str, dict[str, Any]] = {}

    def group(name: str) -> dict[str, Any]:
        return groups.setdefault(
            name,
            {
                "leader": None,
                "term": None,
                "members": [],
                "unowned": [],
                "handoffs": [],
                "orphaned": [],
            },
        )

    for lead in rows.typed(rows.LeaderRow, conn.execute(query("status_leaders"))):
        group(lead.group).update(leader=lead.leader, term=lead.term)
    members: dict[tuple[str, str], dict[str, Any]] = {}
    for m in rows.typed(rows.MemberRow, conn.execute(query("status_members"))):
        entry = {
            "id": m.member,
            "heartbeat_age_s": round(m.heartbeat_age_s, 2),
            "up_s": round(m.up_s, 1),
            "leaving": m.leaving,
            "leader": m.leads,
            "buckets": [],
        }
        members[(m.group, m.member)] = entry
        group(m.group)["members"].append(entry)
    owners = rows.typed(rows.BucketOwnerRow, conn.execute(query("status_bucket_owners")))
    for o in owners:
        if o.group not in groups and o.owner is None and o.next_owner is None:
            continue  # a group that never ran: its 64 empty rows say nothing
        g = group(o.group)
        if o.owner is None:
            g["unowned"].append(o.bucket)
        elif (o.group, o.owner) in members:
            members[(o.group, o.owner)]["buckets"].append(o.bucket)
        else:  # its owner's membership expired: the leader moves it at its next rebalance
            g["orphaned"].append({"bucket": o.bucket, "owner": o.owner})
        if o.next_owner is not None and o.next_owner != o.owner:
            g["handoffs"].append({"bucket": o.bucket, "from": o.owner, "to": o.next_owner})
    return groups


def render_fleet(groups: dict[str, Any]) -> list[str]:
    if not groups:
        return [
            "coordination groups: none in the PostgreSQL coordinator's tables (no worker of it "
            "running; workers coordinated by Redis or static buckets, and skip_locked ones, keep "
            "no members there)"
        ]
    lines = []
    for name, g in sorted(groups.items()):
        leader = f"leader {g['leader']} (term {g['term']})" if g["leader"] else "no leader"
        lines.append(f"workers of group {name}: {len(g['members'])} live, {leader}")
        lines.append(f"  {'member':<32}{'heartbeat':>10}{'up':>10}  buckets")
        for m in g["members"]:
            tags = " (leader)" if m["leader"] else ""
            tags += " (leaving)" if m["leaving"] else ""
            lines.append(
                f"  {m['id'] + tags:<32}{m['heartbeat_age_s']:>9.1f}s{age_text(m['up_s']):>10}  "
                f"{bucket_ranges(m['buckets'])} ({len(m['buckets'])})"
            )
        if g["handoffs"]:
            lines.append(
                "  hand-offs in progress: "
                + ", ".join(f"{h['bucket']} {h['from'] or '-'} -> {h['to']}" for h in g["handoffs"])
            )
        if g["orphaned"]:
            lines.append(
                "  buckets of members no longer live: "
                + ", ".join(f"{o['bucket']} ({o['owner']})" for o in g["orphaned"])
            )
        if g["unowned"]:
            lines.append(f"  buckets without an owner: {bucket_ranges(g['unowned'])}")
    return lines
