"""Uniqueness windows (`dedupe_window_s`) in the store contract: MemoryStore refuses and accepts
exactly the duplicates PostgreSQL does, under either DISPATCHER_COMPLETED_JOBS."""

from __future__ import annotations

import pytest

from dispatcher import JobSpec, enqueue_many
from dispatcher.constants import COMPLETED_JOBS
from dispatcher.db.rows import Failure
from dispatcher.model import STATUS_FAILED, Outcome
from dispatcher.testing import MemoryStore
from tests.contract.store_support import KINDS, Harness, MemoryHarness, PostgresHarness
from tests.contract.test_store_contract import Run, _runner, claim_one

WINDOW_S = 600.0


@pytest.fixture(
    params=[(kind, completed_jobs) for kind in KINDS for completed_jobs in COMPLETED_JOBS],
    ids=lambda p: "-".join(p),
)
def on_each_store(request: pytest.FixtureRequest) -> Run:
    return _runner(request, request.param[1], kind=request.param[0])


async def _bulk(h: Harness, specs: list[JobSpec]) -> int:
    if isinstance(h, MemoryHarness):
        return await enqueue_many(h.memory, specs)
    assert isinstance(h, PostgresHarness)
    await h._sql("SELECT 1")
    assert h._conn is not None
    return await enqueue_many(h._conn, specs)


def test_a_window_holds_the_key_from_enqueue_until_it_passed_after_the_job_finished(
    on_each_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        first = await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S)
        assert first is not None
        assert await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S) is None, "live"
        await h.pass_time(2 * WINDOW_S)
        assert await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S) is None, (
            "live for however long"
        )
        job = await claim_one(h)
        assert (
            await h.store.jobs_complete([job.id], [job.token])
        ).completed == 1  # kept or deleted
        assert await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S) is None, (
            "just finished"
        )
        await h.pass_time(WINDOW_S - 5)
        assert await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S) is None, (
            "within the window"
        )
        await h.pass_time(10)
        second = await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S)
        assert second is not None and second != first, "the window passed"

        job = await claim_one(h)  # a failure holds it too, from when it failed
        assert (
            len(
                await h.store.jobs_fail_owned(
                    [Failure(job.id, job.token, Outcome(STATUS_FAILED, 0.0, "x"))]
                )
            )
            == 1
        )
        await h.pass_time(WINDOW_S - 5)
        assert await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S) is None
        assert await h.enqueue("send", dedupe_key="k") is not None, (
            "without a window: live jobs only, as ever"
        )
        assert await h.enqueue("send", dedupe_key="k", dedupe_window_s=WINDOW_S) is None, (
            "and that one is live"
        )

    on_each_store(test)


def test_bulk_windows_refuse_within_the_batch_and_against_held_keys(on_each_store: Run) -> None:
    async def test(h: Harness) -> None:
        held = await h.enqueue("send", dedupe_key="held", dedupe_window_s=WINDOW_S)
        job = await claim_one(h)
        assert (
            job.id == held and (await h.store.jobs_complete([job.id], [job.token])).completed == 1
        )
        keys = ["held", "a", "a", "b", "held"]
        specs = [
            JobSpec("send", {"n": n}, dedupe_key=k, dedupe_window_s=WINDOW_S)
            for n, k in enumerate(keys)
        ]
        assert await _bulk(h, specs) == 2
        assert await _bulk(h, specs) == 0
        await h.pass_time(WINDOW_S + 1)
        assert await _bulk(h, specs) == 1, "only held's window passed: a and b are live"

    on_each_store(test)


def test_a_window_needs_a_key_and_a_sane_length_and_nothing_is_stored_otherwise() -> None:
    from dispatcher import EnqueueError, enqueue_sync

    store = MemoryStore()
    for options in (
        {"dedupe_window_s": 60.0},
        {"dedupe_key": "k", "dedupe_window_s": 0},
        {"dedupe_key": "k", "dedupe_window_s": float("nan")},
    ):
        with pytest.raises(EnqueueError) as caught:
            enqueue_sync(store, "send", **options)
        assert caught.value.option == "dedupe_window_s"
    assert store.jobs() == []
