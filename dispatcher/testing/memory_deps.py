"""Dependencies in the in-memory store: the rules of sql/deps.sql without PostgreSQL.

A graph's jobs are inserted as the store inserts any job, then made blocked while a parent has not
completed; a job that ends (MemoryStore._release: completed, deleted by its completion, failed for
good, discarded, cancelled) releases its children as deps_release does: counted down, queued at 0,
cancelled or left waiting by their `on_parent_failure`, a batch's callback gathering the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from dispatcher.db.dependencies import UNSUCCESSFUL, GraphJob
from dispatcher.db.port import NewJob
from dispatcher.db.rows import JobState
from dispatcher.errors import EnqueueError
from dispatcher.model import STATUS_BLOCKED, STATUS_CANCELLED, STATUS_COMPLETED, STATUS_QUEUED
from dispatcher.testing.clock import FakeClock


class MemoryStore(Protocol):
    """What of the in-memory store (memory_store.py) this reads and writes."""

    _rows: dict[int, JobState]
    clock: FakeClock

    def insert_jobs(self, jobs: Sequence[NewJob]) -> list[int | None]: ...

    def _write(self, row: JobState, token: str | None = None, **changes: Any) -> JobState: ...


class MemoryDeps:
    """The pending edges: parent id -> {child id: the child's on_parent_failure}."""

    def __init__(self) -> None:
        self.edges: dict[int, dict[int, str]] = {}

    def insert_graph(self, store: MemoryStore, graph: Sequence[GraphJob]) -> list[int]:
        external = {e for g in graph for e in g.external}
        missing = sorted(e for e in external if e not in store._rows)
        if missing:
            raise EnqueueError(
                f"depends_on names job {missing[0]}, which does not exist", "depends_on"
            )
        inserted = store.insert_jobs([g.job for g in graph])
        ids = [int(i) for i in inserted if i is not None]
        ended: list[int] = []
        for n, g in enumerate(graph):
            parents = [ids[p] for p in g.parents]
            for e in g.external:
                status = store._rows[e].status
                if status != STATUS_COMPLETED:
                    parents.append(e)
                    if status in UNSUCCESSFUL:
                        ended.append(e)
            for parent in parents:
                self.edges.setdefault(parent, {})[ids[n]] = g.on_parent_failure
            given = [ids[p] for p in g.parents] + list(g.external)
            store._write(
                store._rows[ids[n]],
                status=STATUS_BLOCKED if parents else STATUS_QUEUED,
                depends_on=given or None,
                pending_parents=len(parents) if given else None,
                batch_id=None if g.batch is None else ids[g.batch],
            )
        for parent in ended:
            self.ended(store, parent)
        return ids

    def ended(self, store: MemoryStore, job_id: int) -> None:
        """Release the children of `job_id` if it ended (its row gone counts as completed)."""
        children = self.edges.get(job_id)
        if not children:
            return
        row = store._rows.get(job_id)
        status = STATUS_COMPLETED if row is None else row.status
        if status != STATUS_COMPLETED and status not in UNSUCCESSFUL:
            return
        now = store.clock.now()
        for child_id, policy in list(children.items()):
            satisfied = status == STATUS_COMPLETED or policy == "run"
            if not satisfied and policy == "wait":
                continue
            del children[child_id]
            child = store._rows.get(child_id)
            if child is None or child.status != STATUS_BLOCKED:
                continue
            payload = _counted(child, status) if child.batch_id == child.id else child.payload
            if not satisfied:
                child = store._write(
                    child,
                    status=STATUS_CANCELLED,
                    last_error=f"parent {job_id} ended {status}",
                    payload=payload,
                    pending_parents=(child.pending_parents or 1) - 1,
                    updated_at=now,
                )
                self.ended(store, child_id)
                continue
            pending = (child.pending_parents or 1) - 1
            store._write(
                child,
                status=STATUS_QUEUED if pending <= 0 else STATUS_BLOCKED,
                run_at=max(child.run_at, now) if pending <= 0 else child.run_at,
                pending_parents=pending,
                payload=payload,
                updated_at=now,
            )
        if not children:
            del self.edges[job_id]


def _counted(callback: JobState, outcome: str) -> bytes:
    """A batch callback's payload with one more member counted under `outcome`."""
    payload: dict[str, Any] = orjson.loads(callback.payload)
    batch = payload.get("batch") or {"id": callback.id, "counts": {}}
    counts = {k: int(batch["counts"].get(k, 0)) for k in _OUTCOMES}
    counts[outcome] += 1
    payload["batch"] = {"id": callback.id, "counts": counts}
    return orjson.dumps(payload)


_OUTCOMES = ("completed", "failed", "discarded", "cancelled")
