"""The Runner's schedules: each slot of the registry's schedules that the fake clock has reached
becomes one job in the MemoryStore, due at its slot, as a fleet that is up enqueues them.

A schedule starts at its first slot after the store's clock when the Runner first sees it (when it
is made, for those declared then), as a newly declared schedule does on a worker. Every slot the
clock then passes gets its job, however far it jumps: in a test, time passes with the fleet up, so
none is missed and `catch_up` has nothing to decide. The slots come from the schedule's `Cadence`
(dispatcher/api/schedules/slots.py): cron expressions, time zones and DST as on a worker.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from dispatcher.api.registry import Registry
from dispatcher.api.schedules.declarations import Schedule
from dispatcher.constants import NUM_BUCKETS
from dispatcher.model import Job
from dispatcher.testing.memory_store import MemoryStore

# Slots of one schedule enqueued at once, at most: a clock moved a year under an every-second
# schedule is a test's mistake, not thirty million jobs.
MAX_SLOTS = 10_000


@dataclass(slots=True)  # not frozen: the port's NewJob declares plain attributes
class _SlotJob:
    """A slot's job, as the store takes it (dispatcher/db/port.py NewJob)."""

    queue: str
    job_type: str
    payload: bytes
    priority: int
    bucket: int
    max_attempts: int | None
    run_at: datetime | None
    delay_s: float = 0.0
    dedupe_key: str | None = None
    ordering_key: str | None = None
    dedupe_window_s: float | None = None
    tags: tuple[str, ...] | None = None


class RunnerSchedules:
    """The cursor (next slot) of each schedule of `registry` in `queues` (None: every queue), and
    the slot of each job it enqueued."""

    def __init__(self, store: MemoryStore, registry: Registry, queues: list[str] | None) -> None:
        self.store = store
        self.registry = registry
        self.queues = queues
        self._next: dict[str, datetime] = {}
        self._slots: dict[int, datetime] = {}  # job id -> its slot (job.scheduled_for)
        self.enqueue_due()

    def enqueue_due(self) -> int:
        """One job per slot at or before the store's clock not enqueued yet; how many."""
        now = self.store.clock.now()
        added = 0
        for s in self.registry.schedules():
            if self.queues is not None and s.queue not in self.queues:
                continue
            cursor = self._next.setdefault(s.name, s.cadence.next_after(now))
            slots: list[datetime] = []
            while cursor <= now:
                if len(slots) == MAX_SLOTS:
                    raise RuntimeError(
                        f"schedule {s.name!r} has over {MAX_SLOTS} slots in the time the clock "
                        f"moved: advance it less at a time"
                    )
                slots.append(cursor)
                cursor = s.cadence.next_after(cursor)
            self._next[s.name] = cursor
            added += self._insert(s, slots)
        return added

    def _insert(self, s: Schedule, slots: list[datetime]) -> int:
        jobs = [
            _SlotJob(
                s.queue,
                s.job_type,
                s.payload,
                s.priority,
                random.randrange(NUM_BUCKETS),  # as the worker's round places them
                s.max_attempts,
                slot,
            )
            for slot in slots
        ]
        ids = self.store.insert_jobs(jobs)
        for job_id, slot in zip(ids, slots, strict=True):
            if job_id is not None:
                self._slots[job_id] = slot
        return len(jobs)

    def with_slot(self, job: Job) -> Job:
        """`job` with its slot as `scheduled_for`, if a schedule enqueued it."""
        slot = self._slots.get(job.id)
        if slot is None:
            return job
        return Job(
            job.id,
            job.job_type,
            job.payload,
            job.attempts,
            job.max_attempts,
            job.locked_at,
            job.bucket,
            job.priority,
            job.ordering_key,
            job.token,
            job.queue,
            slot,
            job.trace_context,
        )
