"""`dispatcher status`: what is queued where, how old the oldest waiting job is, what it costs, how
many jobs wait behind an ordering key and how many keys are halted, the fleet's flow control
(paused queues, limits with what runs under them), its live workers (the worker registry, every
mode and coordinator) and the PostgreSQL coordinator's leaders and bucket owners
(fleet_status.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.fleet_status import (
    read_fleet,
    read_registry,
    render_fleet,
    render_registry,
    worker_dict,
)
from dispatcher.api.flow import PausedQueue
from dispatcher.api.unserved_types import UnservedType, read_unserved, render_unserved
from dispatcher.constants import COMPLETED_DELETE, COMPLETED_KEEP
from dispatcher.db import rows
from dispatcher.db.oneshot import bounded_transaction, session
from dispatcher.db.queries import query
from dispatcher.db.rows import DbPressure
from dispatcher.model import STATUS_COMPLETED, STATUSES

STATUS_BUDGET = 2.0  # its statements may take statement_timeout_s x this (10 s at the defaults)
DELETED_NOTE = (
    "completed: DISPATCHER_COMPLETED_JOBS=delete deletes a job's row when it completes, so "
    "completed jobs are not counted here (a count shown is of rows completed before that was set); "
    "count completions with dispatcher_jobs_completed_total, or in the history (DISPATCHER_HISTORY)"
)


def read_status(
    dsn: str, limits: ConnectionLimits | None = None, *, completed_jobs: str = COMPLETED_KEEP
) -> dict[str, Any]:
    """Counts per queue and status, the oldest due job's age, the backlog per bucket and the
    table's cost, in one transaction bounded like every one-shot command's (db/oneshot.py).
    `completed_jobs` is DISPATCHER_COMPLETED_JOBS as the workers have it: with 'delete' the
    completed count is not what completed (render_status says so).

    "workers": the live workers of the registry (a dict each); "workers_gone": how many stopped or
    vanished within the hour, "workers_vanished" of which without a clean stop (their lease ran
    out); "unserved_types": the job types with jobs that no live worker serves
    (unserved_types.py); "groups": the PostgreSQL coordinator's groups (fleet_status.read_fleet)."""
    limits = limits or ConnectionLimits()
    with (
        session(dsn, limits, application_name="dispatcher-status") as conn,
        bounded_transaction(conn, "status", limits, budget=STATUS_BUDGET),
    ):
        counts: dict[str, dict[str, int]] = {}
        for count in rows.typed(rows.StatusCount, conn.execute(query("status_counts"))):
            counts.setdefault(count.queue, dict.fromkeys(STATUSES, 0))[count.status] = count.jobs
        halted = rows.pairs(conn.execute(query("status_halted_keys")))
        oldest = rows.pairs(conn.execute(query("status_oldest_runnable")))
        backlog = rows.pairs(conn.execute(query("status_backlog_by_bucket")))
        pressure = rows.typed_one(DbPressure, conn.execute(query("db_pressure")).fetchone())
        paused = [p.queue for p in rows.typed(PausedQueue, conn.execute(query("flow_paused_list")))]
        limit_rows = rows.as_dicts(conn.execute(query("flow_limits_list")))
        fleet = read_fleet(conn)
        registry = read_registry(conn)
        unserved = read_unserved(conn)
    for queue in paused:
        # a paused queue shows, even with no jobs
        counts.setdefault(queue, dict.fromkeys(STATUSES, 0))
    return {
        "completed_jobs": completed_jobs,
        "queues": {
            q: {
                "counts": c,
                "oldest_runnable_age_s": oldest.get(q),
                "halted_keys": halted.get(q, 0),
                "paused": q in paused,
            }
            for q, c in counts.items()
        },
        "limits": [{k: v for k, v in r.items() if k != "updated_at"} for r in limit_rows],
        "runnable_by_bucket": backlog,
        "workers": [worker_dict(w) for w in registry.live],
        "workers_gone": len(registry.gone),
        "workers_vanished": sum(w.vanished for w in registry.gone),
        "unserved_types": [dataclasses.asdict(u) for u in unserved],
        "groups": fleet,
        "db": dataclasses.asdict(pressure) if pressure else None,
    }


def render_status(status: dict[str, Any]) -> str:
    deleted = status.get("completed_jobs") == COMPLETED_DELETE

    def cell(counts: dict[str, int], s: str) -> str:
        if deleted and s == STATUS_COMPLETED:  # not a misleading 0: completions leave no row
            return f"{f'{counts[s]}*' if counts[s] else 'deleted*':>11}"
        return f"{counts[s]:>11}"

    lines = [
        f"{'queue':<20}"
        + "".join(f"{s:>11}" for s in STATUSES)
        + f"{'oldest due':>12}{'halted keys':>13}"
    ]
    for queue, info in sorted(status["queues"].items()):
        age = info["oldest_runnable_age_s"]
        name = f"{queue} (paused)" if info.get("paused") else queue
        lines.append(
            f"{name:<20}"
            + "".join(cell(info["counts"], s) for s in STATUSES)
            + (f"{age:>11.1f}s" if age is not None else f"{'-':>12}")
            + f"{info.get('halted_keys', 0):>13}"
        )
    if not status["queues"]:
        lines.append("(no jobs)")
    if any(info.get("halted_keys") for info in status["queues"].values()):
        lines.append(
            "waiting: jobs behind an earlier job of their ordering key; halted keys: "
            "`dispatcher jobs list --halted`"
        )
    if deleted:
        lines.append(f"* {DELETED_NOTE}")
    if status.get("limits"):
        lines.append("")
        lines.append("limits (dispatcher limits list):")
        for limit in status["limits"]:
            bounds = [
                f"max running {limit['max_running']} ({limit['running']} running)"
                if limit["max_running"] is not None
                else "",
                f"{limit['per_second']:g}/s" if limit["per_second"] is not None else "",
            ]
            where = "every queue" if limit["queue_name"] == "*" else f"queue {limit['queue_name']}"
            lines.append(f"  {limit['job_type']} in {where}: " + ", ".join(b for b in bounds if b))
    if "workers" in status:
        lines.append("")
        lines.extend(
            render_registry(status["workers"], status["workers_gone"], status["workers_vanished"])
        )
        lines.extend(render_unserved([UnservedType(**u) for u in status.get("unserved_types", [])]))
    if "groups" in status:
        lines.append("")
        lines.extend(render_fleet(status["groups"]))
    backlog = status["runnable_by_bucket"]
    if backlog:
        lines.append("")
        lines.append("runnable jobs per bucket:")
        cells = [f"{b:>2}:{n:<7}" for b, n in sorted(backlog.items())]
        lines.extend(" ".join(cells[i : i + 8]) for i in range(0, len(cells), 8))
    db = status["db"]
    if db:
        lines.append("")
        lines.append(
            f"table: {db['n_live_tup']} live / {db['n_dead_tup']} dead tuples; "
            f"claim-index tuples read {db['claim_idx_tup_read']}; worker sessions waiting on locks "
            f"{db['lock_waits']}; sessions running a statement {db['active_sessions']}"
        )
    return "\n".join(lines)
