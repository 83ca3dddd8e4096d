"""tests/unit/test_ordering_property.py's sequences on PostgreSQL: each is replayed on the real
JobStore (a queue of its own per example, in one database) and on MemoryStore, ordering keys' rules
are checked after every step on both, and both must see the same thing at every step (the same
claims, outcomes and statuses). Fewer examples than the unit test: each costs ~100 statements.

Without the operator's steps (cancel, retry or cancel of a halted job): on PostgreSQL those are
dispatcher.admin's changes, which promote the keys they release after the change commits (tested
in tests/integration/test_ordering_admin.py). The port's own JobStore.jobs_cancel runs
admin_jobs_cancel alone, so a cancelled holder's key waits for the KeySweeper there, where
MemoryStore promotes its next job at once: the replay would see a key with waiting jobs and no
holder after ("enqueue", "k0", 0), ("enqueue", "k0", 0), ("cancel", 0).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings

from dispatcher import JobSpec, enqueue, enqueue_many
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

    async def enqueue(self, keys: list[str | None], priority: int) -> None:
        if len(keys) == 1:
            await enqueue(self.conn, "t", {}, queue=self.queue, ordering_key=keys[0], priority=priority)
        else:
            await enqueue_many(self.conn, [JobSpec("t", {}, queue=self.queue, ordering_key=k) for k in keys])

    async def rows(self) -> list[Row]:
        cur = await self.conn.execute("SELECT id, ordering_key, status, ordering_halted, priority, run_at "
                                      "FROM dispatcher_jobs WHERE queue_name = %s ORDER BY id", (self.queue,))
        return [Row(*row) for row in await cur.fetchall()]

    async def retry(self, job_id: int) -> None:
        raise AssertionError("operator steps are not replayed on PostgreSQL here")

    async def tick(self) -> None:
        pass  # the server's clock moves on by itself


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps(operator=False, max_size=30))
def test_postgres_keeps_the_ordering_rules_step_by_step_as_the_memory_store_does(dsn: str,
                                                                                  sequence: list[Step]) -> None:
    async def both() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            target = PostgresTarget(dsn, conn)
            try:
                on_postgres = await replay(target, sequence)
            finally:
                await target.job_store.close()
        on_memory = await replay(MemoryTarget(), sequence)
        for step, (pg, memory) in enumerate(zip(on_postgres, on_memory, strict=True)):
            assert pg == memory, f"step {step} {sequence[step] if step < len(sequence) else 'drain'}: {pg} != {memory}"

    run_async(both())
