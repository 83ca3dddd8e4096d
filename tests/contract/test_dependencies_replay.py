"""tests/unit/test_dependencies_property.py's graphs and steps on PostgreSQL: each is replayed on
the real JobStore (a queue of its own per example, in one database) and on MemoryStore; the rule
is checked after every step on both, and both must see the same statuses at every step. Fewer
examples than the unit test: each costs tens of statements. The operator's retry goes through
dispatcher.admin, as `dispatcher jobs retry` does."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings

from dispatcher import Workflow, enqueue_workflow
from dispatcher.admin import Filters, retry_jobs
from dispatcher.db.port import JobStorePort
from dispatcher.db.store import JobStore
from tests.dependency_steps import Node, Step, graphs, replay, step_lists
from tests.helpers import run_async
from tests.unit.test_dependencies_property import MemoryTarget


class PostgresTarget:
    def __init__(self, dsn: str, conn: psycopg.AsyncConnection[Any]) -> None:
        self.job_store = JobStore(dsn, "w1")
        self.store: JobStorePort = self.job_store
        self.queue = f"q{uuid.uuid4().hex[:8]}"
        self.conn = conn
        self.dsn = dsn

    async def insert(self, workflow: Workflow) -> list[int]:
        return list((await enqueue_workflow(self.conn, workflow)).values())

    async def statuses(self, ids: list[int]) -> list[str]:
        cur = await self.conn.execute(
            "SELECT i.id, coalesce(j.status, 'gone') FROM unnest(%s::bigint[]) AS i(id) "
            "LEFT JOIN dispatcher_jobs AS j ON j.id = i.id",
            (ids,),
        )
        found = dict(await cur.fetchall())
        return [found[i] for i in ids]

    async def retry(self, job_id: int) -> bool:
        result = await asyncio.to_thread(retry_jobs, self.dsn, Filters(ids=(job_id,)))
        return list(result.changed) == [job_id]

    async def tick(self) -> None:
        pass  # the server's clock moves on by itself


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(graphs(), step_lists())
def test_postgres_keeps_the_dependency_rule_step_by_step_as_the_memory_store_does(
    dsn: str, graph: list[Node], steps: list[Step]
) -> None:
    async def both() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            target = PostgresTarget(dsn, conn)
            try:
                on_postgres = await replay(target, graph, steps)
            finally:
                await target.job_store.close()
        on_memory = await replay(MemoryTarget(), graph, steps)
        assert on_postgres == on_memory

    run_async(both())
