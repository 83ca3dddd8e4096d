"""The two stores of the store contract suite (test_store_contract.py), behind one harness each.

A harness enqueues with the call users write (`dispatcher.enqueue` on a connection, or on the
in-memory store), hands out the port, and moves time for a job the way each store can: the
PostgreSQL one rewrites the row's times (its clock is the server's), the in-memory one advances
its FakeClock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from dispatcher import enqueue
from dispatcher.api.enqueue import AsyncTarget
from dispatcher.constants import COMPLETED_KEEP
from dispatcher.db.port import JobStorePort
from dispatcher.db.store import JobStore
from dispatcher.testing import MemoryStore

KINDS = ["postgres", "memory"]


class Harness:
    store: JobStorePort
    completed_jobs: str = COMPLETED_KEEP  # DISPATCHER_COMPLETED_JOBS of its stores

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> int | None:
        raise NotImplementedError

    async def claimer(self, worker_id: str) -> JobStorePort:
        """Another worker's handle on the same jobs (closed with the harness)."""
        raise NotImplementedError

    async def target(self) -> AsyncTarget:
        """What enqueue is given here (a connection, or the in-memory store), for the calls
        beside `enqueue`: workflows, batches."""
        raise NotImplementedError

    def wake(self) -> None:
        """What a worker's listener passes on from a NOTIFY (a released child's, say): on a Citus
        cluster the next claim visits a bucket it found empty just now (a no-op elsewhere)."""

    async def cancel(self, ids: list[int]) -> None:
        """An operator's cancel (the store's jobs_cancel), with what admin.py does after it."""
        await self.store.jobs_cancel(ids)

    async def now(self) -> datetime:
        raise NotImplementedError

    async def make_due(self, job_id: int) -> None:
        """Time passes until the job's run_at."""
        raise NotImplementedError

    async def expire_lease(self, job_id: int) -> None:
        """Time passes until just after the job's lease ends (nobody extended it)."""
        raise NotImplementedError

    async def pass_time(self, seconds: float) -> None:
        """`seconds` pass for what has ended: finished jobs and their uniqueness windows."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


class PostgresHarness(Harness):
    def __init__(self, dsn: str, completed_jobs: str = COMPLETED_KEEP) -> None:
        self._dsn = self.dsn = dsn
        self.completed_jobs = completed_jobs
        self.store = JobStore(dsn, "w1", completed_jobs=completed_jobs)
        self._others: list[JobStore] = []
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def _sql(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        if self._conn is None:
            self._conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        cur = await self._conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> int | None:
        job_id = await enqueue(await self.target(), job_type, payload, **options)
        self._wake()
        return job_id

    async def target(self) -> AsyncTarget:
        if self._conn is None:
            await self._sql("SELECT 1")
        assert self._conn is not None
        return self._conn

    def wake(self) -> None:
        self._wake()

    def _wake(self) -> None:
        """What a worker's listener passes on from the enqueue's NOTIFY or a due timer: on a
        Citus cluster the next claim visits a bucket it found empty just now (a no-op on one
        node)."""
        for store in [self.store, *self._others]:
            store.note_ready(None)  # type: ignore[attr-defined]

    async def claimer(self, worker_id: str) -> JobStorePort:
        other = JobStore(self._dsn, worker_id, completed_jobs=self.completed_jobs)
        self._others.append(other)
        return other

    async def now(self) -> datetime:
        return (await self._sql("SELECT now()"))[0][0]

    async def make_due(self, job_id: int) -> None:
        await self._sql("UPDATE dispatcher_jobs SET run_at = now() WHERE id = %s", (job_id,))
        self._wake()

    async def expire_lease(self, job_id: int) -> None:
        await self._sql(
            "UPDATE dispatcher_jobs SET lease_expires_at = now() - interval '1 ms' WHERE id = %s",
            (job_id,),
        )

    async def pass_time(self, seconds: float) -> None:
        shift = {"s": seconds}
        await self._sql(
            "UPDATE dispatcher_jobs SET updated_at = updated_at - %(s)s * interval '1 second', "
            "created_at = created_at - %(s)s * interval '1 second'",
            shift,
        )
        await self._sql(
            "UPDATE dispatcher_dedupe_windows SET enqueued_at = enqueued_at - %(s)s * interval '1 "
            "second', finished_at = finished_at - %(s)s * interval '1 second'",
            shift,
        )

    async def close(self) -> None:
        for store in [self.store, *self._others]:
            await store.close()  # type: ignore[attr-defined]
        if self._conn is not None:
            await self._conn.close()


class MemoryHarness(Harness):
    def __init__(self, completed_jobs: str = COMPLETED_KEEP) -> None:
        self.completed_jobs = completed_jobs
        self.store = self.memory = MemoryStore(worker_id="w1", completed_jobs=completed_jobs)

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> int | None:
        return await enqueue(self.memory, job_type, payload, **options)

    async def claimer(self, worker_id: str) -> JobStorePort:
        return self.memory  # one store in one process: its lock is what claimers contend on

    async def target(self) -> AsyncTarget:
        return self.memory

    async def now(self) -> datetime:
        return self.memory.clock.now()

    async def make_due(self, job_id: int) -> None:
        job = self.memory.get(job_id)
        assert job is not None
        self.memory.clock.advance_to(job.run_at)

    async def expire_lease(self, job_id: int) -> None:
        job = self.memory.get(job_id)
        assert job is not None and job.lease_expires_at is not None
        self.memory.clock.advance_to(job.lease_expires_at)
        self.memory.clock.advance(0.001)

    async def pass_time(self, seconds: float) -> None:
        self.memory.clock.advance(seconds)


async def open_harness(kind: str, dsn: str | None, completed_jobs: str = COMPLETED_KEEP) -> Harness:
    """A harness on a fresh store of `kind`; `completed_jobs`: DISPATCHER_COMPLETED_JOBS of its
    stores."""
    if kind == "postgres":
        assert dsn is not None
        return PostgresHarness(dsn, completed_jobs)
    return MemoryHarness(completed_jobs)
