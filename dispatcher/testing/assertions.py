"""Assertions on what code under test enqueued, in the spirit of Oban.Testing's `assert_enqueued`
and River's `RequireInserted`: each failure message lists what the store does hold.

A `payload` that is a dict matches a job whose payload holds at least those keys with those
values (as Oban's `args`); any other payload must be equal. A typed task (`@registry.task`) stands
for its job type; its payload is its arguments by name (`task.payload(...)` builds one).
"""

from __future__ import annotations

from typing import Any

from dispatcher.api.tasks import Task
from dispatcher.db.rows import JobState
from dispatcher.model import STATUS_QUEUED
from dispatcher.testing.memory_store import MemoryStore

_ANY = object()
JobType = str | Task[..., Any]  # a job type, or the typed task whose job type it is


def _name(job_type: JobType | None) -> str | None:
    return job_type.job_type if isinstance(job_type, Task) else job_type


def _matches(job: JobState, payload: Any) -> bool:
    if payload is _ANY:
        return True
    if isinstance(payload, dict) and isinstance(job.payload, dict):
        return all(
            key in job.payload and job.payload[key] == value for key, value in payload.items()
        )
    return bool(job.payload == payload)


def enqueued(
    store: MemoryStore,
    job_type: JobType | None = None,
    payload: Any = _ANY,
    *,
    queue: str | None = None,
    status: str | None = STATUS_QUEUED,
) -> list[JobState]:
    """Jobs that match, oldest first (`status=None`: in any status)."""
    return [
        j for j in store.jobs(status, job_type=_name(job_type), queue=queue) if _matches(j, payload)
    ]


def _describe(store: MemoryStore) -> str:
    held = [
        f"#{j.id} {j.job_type} {j.status} in {j.queue!r} run_at={j.run_at.isoformat()} "
        f"payload={j.payload!r}"
        for j in store.jobs()
    ]
    return "\n  ".join(["the store holds:", *held]) if held else "the store holds no job"


def assert_enqueued(
    store: MemoryStore,
    job_type: JobType,
    payload: Any = _ANY,
    *,
    queue: str | None = None,
    status: str | None = STATUS_QUEUED,
    count: int | None = None,
) -> JobState:
    """At least one matching job (exactly `count`, if given); returns the newest. Queued ones by
    default."""
    found = enqueued(store, job_type, payload, queue=queue, status=status)
    if not found or (count is not None and len(found) != count):
        name = _name(job_type)
        wanted = f"{'a' if count is None else count} {status or ''} {name!r} job(s)".replace(
            "  ", " "
        )
        detail = "" if payload is _ANY else f" with payload {payload!r}"
        where = "" if queue is None else f" in queue {queue!r}"
        raise AssertionError(
            f"expected {wanted}{detail}{where}, found {len(found)}; {_describe(store)}"
        )
    return found[-1]


def refute_enqueued(
    store: MemoryStore,
    job_type: JobType,
    payload: Any = _ANY,
    *,
    queue: str | None = None,
    status: str | None = STATUS_QUEUED,
) -> None:
    """No matching job (queued ones by default)."""
    found = enqueued(store, job_type, payload, queue=queue, status=status)
    if found:
        raise AssertionError(
            f"expected no {_name(job_type)!r} job like this, found {[j.id for j in found]}; "
            f"{_describe(store)}"
        )
