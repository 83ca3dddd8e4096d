"""Jobs that depend on jobs: a graph's insert and the release of a finished parent's children.

A graph (dispatcher/api/workflows.py builds it: a workflow, a batch, or one job with
`depends_on`) is inserted in one transaction of four statements (sql/deps.sql): ids taken, the
existing parents marked under their row locks, the jobs inserted (blocked while a parent has not
completed), the edges inserted. The statement that ends a parent is followed by `release`, which
deletes its edges and counts its children down; the dependency sweeper releases what a worker that
died in between left behind. Why this is race-free: docs/design/dependencies.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import psycopg

from dispatcher.constants import NOTIFY_CHANNEL, RESULTS_CHANNEL
from dispatcher.db import rows
from dispatcher.db.inserts import trace_json
from dispatcher.db.literals import int_array, tag_array
from dispatcher.db.port import GraphJob as GraphJob  # (defined with the port: re-exported)
from dispatcher.db.queries import query
from dispatcher.errors import EnqueueError
from dispatcher.model import STATUS_CANCELLED, STATUS_COMPLETED, STATUS_DISCARDED, STATUS_FAILED

# A parent that ended so applies its children's on_parent_failure at once.
UNSUCCESSFUL = (STATUS_FAILED, STATUS_DISCARDED, STATUS_CANCELLED)
# Cancelled children with children of their own are released in turn, this many rounds in one
# call; deeper cascades go on in the dependency sweeper's next pass.
CASCADE_ROUNDS = 50


@dataclass(frozen=True, slots=True)
class ParentState:
    """An existing parent, as deps_parents_mark left it: marked, and its status then."""

    id: int
    bucket: int
    status: str


@dataclass(slots=True)
class GraphRows:
    """A graph's jobs and edges as the insert statements take them, and the existing parents that
    ended without success (released once the graph is in)."""

    jobs: dict[str, Any] = field(default_factory=dict)
    edges: dict[str, list[Any]] = field(default_factory=dict)
    ended_parents: list[int] = field(default_factory=list)


def _literal(values: Sequence[object]) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def graph_rows(
    graph: Sequence[GraphJob], ids: Sequence[int], parents: dict[int, ParentState]
) -> GraphRows:
    """The statements' parameters for `graph` under `ids`, given its existing parents' states. A
    missing parent is refused: nothing is written."""
    missing = sorted({e for g in graph for e in g.external} - parents.keys())
    if missing:
        raise EnqueueError(
            f"depends_on names job {missing[0]}, which does not exist"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""),
            "depends_on",
        )
    has_children = [False] * len(graph)
    for g in graph:
        for p in g.parents:
            has_children[p] = True
    out = GraphRows()
    edges: dict[str, list[Any]] = {
        k: [] for k in ("parent_ids", "parent_buckets", "child_ids", "child_buckets", "policies")
    }
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "queues",
            "job_types",
            "payloads",
            "priorities",
            "buckets",
            "max_attempts",
            "run_ats",
            "delays_s",
            "pendings",
            "depends_on",
            "has_dependents",
            "batch_ids",
            "tags",
        )
    }
    ended: set[int] = set()
    for n, g in enumerate(graph):
        job, child_id = g.job, ids[n]
        waits_for: list[tuple[int, int]] = [(ids[p], graph[p].job.bucket) for p in g.parents]
        for e in g.external:
            state = parents[e]
            if state.status == STATUS_COMPLETED:
                continue
            waits_for.append((e, state.bucket))
            if state.status in UNSUCCESSFUL:
                ended.add(e)
        for parent_id, parent_bucket in waits_for:
            edges["parent_ids"].append(parent_id)
            edges["parent_buckets"].append(parent_bucket)
            edges["child_ids"].append(child_id)
            edges["child_buckets"].append(job.bucket)
            edges["policies"].append(g.on_parent_failure)
        given = [ids[p] for p in g.parents] + list(g.external)
        tags = getattr(job, "tags", None)
        cols["queues"].append(job.queue)
        cols["job_types"].append(job.job_type)
        cols["payloads"].append(bytes(job.payload).decode())
        cols["priorities"].append(job.priority)
        cols["buckets"].append(job.bucket)
        cols["max_attempts"].append(job.max_attempts)
        cols["run_ats"].append(job.run_at)
        cols["delays_s"].append(job.delay_s)
        cols["pendings"].append(len(waits_for) if given else None)
        cols["depends_on"].append(_literal(given) if given else None)
        cols["has_dependents"].append(True if has_children[n] else None)
        cols["batch_ids"].append(None if g.batch is None else ids[g.batch])
        cols["tags"].append(tag_array(tags) if tags else None)
    out.jobs = {"ids": int_array(ids), **cols}
    out.edges = edges
    out.ended_parents = sorted(ended)
    return out


def _parent_states(found: Sequence[Sequence[Any]]) -> dict[int, ParentState]:
    return {state.id: state for state in rows.typed(ParentState, found)}


def _external(graph: Sequence[GraphJob]) -> list[int]:
    return sorted({e for g in graph for e in g.external})


def release_params(ids: Sequence[int]) -> dict[str, Any]:
    """deps_release's parameters: the parents that ended."""
    return {"ids": int_array(ids), "channel": NOTIFY_CHANNEL, "results_channel": RESULTS_CHANNEL}


def _jobs_params(graph_rows_: GraphRows) -> dict[str, Any]:
    return {**graph_rows_.jobs, "channel": NOTIFY_CHANNEL, "trace_context": trace_json()}


@dataclass(frozen=True, slots=True)
class Released:
    """deps_release's row: children queued, cancelled children that have children, NOTIFYs."""

    queued: int
    cascade: list[int]
    notified: int


# -- async -----------------------------------------------------------------------------------------


def _own_transaction_async(conn: psycopg.AsyncConnection[Any]) -> AbstractAsyncContextManager[Any]:
    """A graph goes in whole: in a transaction of our own in autocommit mode, else the caller's."""
    return conn.transaction() if conn.autocommit else nullcontext()


async def insert_graph_async(
    conn: psycopg.AsyncConnection[Any], graph: Sequence[GraphJob]
) -> list[int]:
    """Insert `graph`; each job's id, in graph order."""
    async with _own_transaction_async(conn):
        cur = await conn.execute(query("deps_ids_take"), {"n": len(graph)})
        ids: list[int] = sorted(rows.value(await cur.fetchone()))
        external = _external(graph)
        found: list[Any] = []
        if external:
            cur = await conn.execute(query("deps_parents_mark"), {"ids": int_array(external)})
            found = await cur.fetchall()
        plan = graph_rows(graph, ids, _parent_states(found))
        await conn.execute(query("deps_jobs_insert"), _jobs_params(plan))
        if plan.edges["child_ids"]:
            await conn.execute(query("deps_edges_insert"), plan.edges)
        if plan.ended_parents:
            await release_async(conn, plan.ended_parents)
    return ids


async def release_async(conn: psycopg.AsyncConnection[Any], parents: Sequence[int]) -> int:
    """Release the children of `parents` (ended), and the children of those it cancels, a few
    rounds deep; how many children became queued."""
    queued, ids = 0, list(parents)
    for _ in range(CASCADE_ROUNDS):
        if not ids:
            break
        cur = await conn.execute(query("deps_release"), release_params(ids))
        released = rows.typed_one(Released, await cur.fetchone())
        if released is None:
            break
        queued += released.queued
        ids = released.cascade
    return queued


# -- sync (web apps, scripts, the CLI, the admin API) ----------------------------------------------


def _own_transaction_sync(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    return conn.transaction() if conn.autocommit else nullcontext()


def insert_graph_sync(conn: psycopg.Connection[Any], graph: Sequence[GraphJob]) -> list[int]:
    with _own_transaction_sync(conn):
        ids: list[int] = sorted(
            rows.value(conn.execute(query("deps_ids_take"), {"n": len(graph)}).fetchone())
        )
        external = _external(graph)
        found: list[Any] = []
        if external:
            found = conn.execute(
                query("deps_parents_mark"), {"ids": int_array(external)}
            ).fetchall()
        plan = graph_rows(graph, ids, _parent_states(found))
        conn.execute(query("deps_jobs_insert"), _jobs_params(plan))
        if plan.edges["child_ids"]:
            conn.execute(query("deps_edges_insert"), plan.edges)
        if plan.ended_parents:
            release_sync(conn, plan.ended_parents)
    return ids


def release_sync(conn: psycopg.Connection[Any], parents: Sequence[int]) -> int:
    return release_rounds(
        parents, lambda params: conn.execute(query("deps_release"), params).fetchone()
    )


def release_rounds(
    parents: Sequence[int], send: Callable[[dict[str, Any]], Sequence[Any] | None]
) -> int:
    """release_async's rounds for sync callers, `send` running deps_release with its parameters
    and answering its one row (release_sync on a connection, admin.py through its session)."""
    queued, ids = 0, list(parents)
    for _ in range(CASCADE_ROUNDS):
        if not ids:
            break
        released = rows.typed_one(Released, send(release_params(ids)))
        if released is None:
            break
        queued += released.queued
        ids = released.cascade
    return queued
