"""tests/unit/test_ordering_property.py's sequences on PostgreSQL: each is replayed on the real
JobStore (a queue of its own per example, in one database) and on MemoryStore, ordering keys' rules
are checked after every step on both, and both must see the same thing at every step (the same
claims, outcomes and statuses). Fewer examples than the unit test: each costs ~100 statements.

The operator's steps too: a cancel through the port (JobStore.jobs_cancel, which promotes the keys
it releases), a retry of a halted job through dispatcher.admin, as `dispatcher jobs retry` does.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings

from dispatcher import JobSpec, enqueue, enqueue_many
from dispatcher.admin import Filters, retry_jobs
from dispatcher.db.port import JobStorePort
from dispatcher.db.store import JobStore
from tests.helpers import run_async
from tests.ordering_steps import Row, Step, replay, steps
from tests.unit.test_ordering_property import MemoryTarget


class PostgresTarget:
    def __init__(self, dsn: str, conn: psycopg.AsyncConnection[Any]) -> None:
        self.job_store = JobStore(dsn, "w1")
        self.store: JobStorePort = self.job_store
        self.queue = f"q{uuid.uuid4().hex[:8]}"
        self.conn = conn
        self.dsn = dsn

    async def enqueue(self, keys: list[str | None], priority: int) -> None:
        if len(keys) == 1:
            await enqueue(
                self.conn, "t", {}, queue=self.queue, ordering_key=keys[0], priority=priority
            )
        else:
            await enqueue_many(
                self.conn, [JobSpec("t", {}, queue=self.queue, ordering_key=k) for k in keys]
            )

    async def rows(self) -> list[Row]:
        cur = await self.conn.execute(
            "SELECT id, ordering_key, status, ordering_halted, priority, run_at "
            "FROM dispatcher_jobs WHERE queue_name = %s ORDER BY id",
            (self.queue,),
        )
        return [Row(*row) for row in await cur.fetchall()]

    async def retry(self, job_id: int) -> None:
        result = await asyncio.to_thread(retry_jobs, self.dsn, Filters(ids=(job_id,)))
        assert list(result.changed) == [job_id], result

    async def tick(self) -> None:
        pass  # the server's clock moves on by itself


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps(max_size=30))
def test_postgres_keeps_the_ordering_rules_step_by_step_as_the_memory_store_does(
    dsn: str, sequence: list[Step]
) -> None:
    async def both() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            target = PostgresTarget(dsn, conn)
            try:
                on_postgres = await replay(target, sequence)
            finally:
                await target.job_store.close()
        on_memory = await replay(MemoryTarget(), sequence)
        for step, (pg, memory) in enumerate(zip(on_postgres, on_memory, strict=True)):
            assert pg == memory, (
                f"step {step} {sequence[step] if step < len(sequence) else 'drain'}: "
                f"{pg} != {memory}"
            )

    run_async(both())
