"""The fleet part of `dispatcher status`: the live workers of each coordination group, its leader
and who owns which bucket (the PostgreSQL coordinator's tables), in text and as JSON.

Workers coordinated by Redis or with static buckets keep no rows there: the section says so.
"""

from __future__ import annotations

from typing import Any

import psycopg

from dispatcher.api.text import age_text, bucket_ranges
from dispatcher.db import rows
from dispatcher.db.queries import query


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
            "workers: none in the PostgreSQL coordinator's tables (none running, or coordinated by "
            "Redis or static buckets: their members are not kept in the database)"
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
