"""Tags in the store contract: the in-memory store keeps a job's tags as PostgreSQL does (one job,
a keyed one, a bulk enqueue), None for a job without, and gives out a copy."""

from __future__ import annotations

from dispatcher import JobSpec, enqueue_many
from tests.contract.store_support import Harness, MemoryHarness, PostgresHarness
from tests.contract.test_store_contract import Run, on_store

__all__ = ["on_store"]  # a fixture, used by name


async def _bulk(h: Harness, specs: list[JobSpec]) -> int:
    if isinstance(h, MemoryHarness):
        return await enqueue_many(h.memory, specs)
    assert isinstance(h, PostgresHarness)
    await h._sql("SELECT 1")
    assert h._conn is not None
    return await enqueue_many(h._conn, specs)


async def _ids_of(h: Harness, job_type: str) -> list[int]:
    if isinstance(h, MemoryHarness):
        return [j.id for j in h.memory.jobs(job_type=job_type)]
    assert isinstance(h, PostgresHarness)
    return [
        i
        for (i,) in await h._sql("SELECT id FROM dispatcher_jobs WHERE job_type = %s", (job_type,))
    ]


def test_a_job_keeps_its_tags_and_one_without_has_none(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        tagged = await h.enqueue("send", tags=["b", "a", "b"])
        bare = await h.enqueue("send")
        keyed = await h.enqueue("send", ordering_key="k", tags=("k",))
        assert tagged is not None and bare is not None and keyed is not None
        assert await _bulk(h, [JobSpec("bulk", tags=["x"]), JobSpec("bulk", ordering_key="k")])
        got = {i: await h.store.job_get(i) for i in (tagged, bare, keyed)}
        assert [None if j is None else j.tags for j in got.values()] == [["b", "a"], None, ["k"]]
        shown = got[tagged]
        assert shown is not None and shown.tags is not None
        shown.tags.append("edited")  # a copy: the store's row stays as enqueued
        again = await h.store.job_get(tagged)
        assert again is not None and again.tags == ["b", "a"]
        bulk = [await h.store.job_get(i) for i in await _ids_of(h, "bulk")]
        assert sorted(str(j.tags) for j in bulk if j is not None) == ["None", "['x']"]

    on_store(test)
