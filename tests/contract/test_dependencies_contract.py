"""Dependencies between jobs, workflows and batches: the same assertions against PostgreSQL and the
in-memory store (tests/contract/test_store_contract.py). A child is claimable exactly when every
parent completed; a parent that ends otherwise applies each child's on_parent_failure."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from dispatcher import (
    EnqueueError,
    JobSpec,
    Workflow,
    admin,
    enqueue_batch,
    enqueue_many,
    enqueue_workflow,
)
from dispatcher.api.job_filters import Filters
from dispatcher.db.rows import Failure
from dispatcher.model import (
    STATUS_BLOCKED,
    STATUS_CANCELLED,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_QUEUED,
    Job,
    Outcome,
)
from dispatcher.testing import MemoryStore
from tests.contract import test_store_contract as store_contract
from tests.contract.store_support import Harness, PostgresHarness
from tests.contract.test_store_contract import (
    OTHER_TOKEN,
    Run,
    on_store,
    on_store_completing,
)

__all__ = ["on_store", "on_store_completing"]  # fixtures, used by name

FAILED = Outcome(STATUS_FAILED, 0.0, "boom")


async def claim_one(h: Harness) -> Job:
    """test_store_contract.claim_one, woken first (as in claimable)."""
    h.wake()
    return await store_contract.claim_one(h)


async def status(h: Harness, job_id: int) -> str | None:
    state = await h.store.job_get(job_id)
    return None if state is None else state.status


async def claimable(h: Harness) -> list[int]:
    """The ids a claim takes now (they are then running under that claim), woken first as a
    worker is by the NOTIFY of the statement that queued them."""
    h.wake()
    return sorted(j.id for j in (await h.store.jobs_claim("default", 100, 30.0, None)).jobs)


async def run_to_completion(h: Harness, job_id: int) -> None:
    job = await claim_one(h)
    assert job.id == job_id
    done = await h.store.jobs_complete([job.id], [job.token])
    assert done.completed == 1


async def fail_for_good(h: Harness, job_id: int) -> None:
    job = await claim_one(h)
    assert job.id == job_id
    assert [
        w.status for w in await h.store.jobs_fail_owned([Failure(job.id, job.token, FAILED)])
    ] == [STATUS_FAILED]


def test_a_child_is_blocked_until_its_parent_completes_then_claimable(
    on_store_completing: Run,
) -> None:
    async def test(h: Harness) -> None:
        parent = await h.enqueue("a")
        assert parent is not None
        child = await h.enqueue("b", depends_on=[parent])
        assert child is not None and await status(h, child) == STATUS_BLOCKED
        state = await h.store.job_get(child)
        assert state is not None and (state.depends_on, state.pending_parents) == ([parent], 1)
        job = await claim_one(h)
        assert job.id == parent, "only the parent is claimable"
        assert await claimable(h) == [], "the child stays blocked while its parent runs"
        await h.store.jobs_complete([job.id], [job.token])
        assert await status(h, child) == STATUS_QUEUED
        assert await claimable(h) == [child]

    on_store_completing(test)


def test_a_fan_in_runs_once_after_the_last_of_its_parents(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        wf = Workflow()
        for n in range(3):
            wf.add(f"p{n}", "part", {"n": n})
        wf.add("sink", "sum", after=["p0", "p1", "p2"])
        ids = await enqueue_workflow(await h.target(), wf)
        assert list(ids) == ["p0", "p1", "p2", "sink"]
        jobs = (await h.store.jobs_claim("default", 10, 30.0, None)).jobs
        assert sorted(j.id for j in jobs) == [ids["p0"], ids["p1"], ids["p2"]]
        by_id = {j.id: j for j in jobs}
        for n, name in enumerate(("p0", "p1", "p2")):
            job = by_id[ids[name]]
            await h.store.jobs_complete([job.id], [job.token])
            state = await h.store.job_get(ids["sink"])
            assert state is not None
            if n < 2:
                assert (state.status, state.pending_parents) == (STATUS_BLOCKED, 2 - n)
            else:
                assert (state.status, state.pending_parents) == (STATUS_QUEUED, 0)
        assert await claimable(h) == [ids["sink"]]

    on_store(test)


def test_a_completion_refused_by_its_fence_releases_nothing(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        parent = await h.enqueue("a")
        child = await h.enqueue("b", depends_on=[parent])
        job = await claim_one(h)
        done = await h.store.jobs_complete([job.id], [OTHER_TOKEN])
        assert done.fenced == [job.id]
        assert child is not None and await status(h, child) == STATUS_BLOCKED

    on_store(test)


@pytest.mark.parametrize(
    ("policy", "child_status"),
    [("cancel", STATUS_CANCELLED), ("run", STATUS_QUEUED), ("wait", STATUS_BLOCKED)],
)
def test_a_parent_that_fails_for_good_applies_each_childs_policy(
    on_store: Run, policy: str, child_status: str
) -> None:
    async def test(h: Harness) -> None:
        parent = await h.enqueue("a")
        assert parent is not None
        child = await h.enqueue("b", depends_on=[parent], on_parent_failure=policy)  # type: ignore[arg-type]
        grandchild = await h.enqueue("c", depends_on=[child])
        assert child is not None and grandchild is not None
        await fail_for_good(h, parent)
        assert await status(h, child) == child_status
        state = await h.store.job_get(child)
        assert state is not None
        if policy == "cancel":
            assert state.last_error == f"parent {parent} ended failed"
            assert await status(h, grandchild) == STATUS_CANCELLED, "the cancel cascades"
        else:
            assert await status(h, grandchild) == STATUS_BLOCKED
        if policy == "wait":  # an operator retries the parent; once it completes, the child runs
            assert await claimable(h) == []
            assert await _retry(h, parent)
            await run_to_completion(h, parent)
            assert await status(h, child) == STATUS_QUEUED

    on_store(test)


async def _retry(h: Harness, job_id: int) -> bool:
    """An operator's retry of a failed job (dispatcher jobs retry --id)."""
    if isinstance(h.store, MemoryStore):
        return h.store.retry([job_id]) == [job_id]
    assert isinstance(h, PostgresHarness)
    result = await asyncio.to_thread(admin.retry_jobs, h.dsn, Filters(ids=(job_id,)))
    return result.changed == [job_id]


def test_depending_on_jobs_that_ended_already(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        done = await h.enqueue("a")
        assert done is not None
        await run_to_completion(h, done)
        failed = await h.enqueue("a")  # one at a time: a cluster claims bucket by bucket
        assert failed is not None
        await fail_for_good(h, failed)
        ready = await h.enqueue("b", depends_on=[done])
        doomed = await h.enqueue("b", depends_on=[done, failed])
        anyway = await h.enqueue("b", depends_on=[failed], on_parent_failure="run")
        assert ready is not None and doomed is not None and anyway is not None
        assert await status(h, ready) == STATUS_QUEUED, "a completed parent is no wait"
        assert await status(h, doomed) == STATUS_CANCELLED, "a failed parent cancels at once"
        assert await status(h, anyway) == STATUS_QUEUED
        assert await claimable(h) == [ready, anyway]

    on_store(test)


def test_a_missing_parent_is_refused_and_nothing_is_written(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        parent = await h.enqueue("a")
        assert parent is not None
        with pytest.raises(EnqueueError, match="depends_on names job 999999"):
            await h.enqueue("b", depends_on=[parent, 999999])
        wf = Workflow()
        wf.add("x", "a")
        wf.add("y", "b", after=["x", 999999])
        with pytest.raises(EnqueueError, match="999999"):
            await enqueue_workflow(await h.target(), wf)
        assert await claimable(h) == [parent], "nothing of either was written"
        state = await h.store.job_get(parent + 1)
        assert state is None or state.job_type == "a"

    on_store(test)


def test_a_keyed_job_beside_jobs_with_parents_is_refused_not_written_without_its_key(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        parent = await h.enqueue("a")
        assert parent is not None
        specs = [JobSpec("b", depends_on=[parent]), JobSpec("c", dedupe_key="once")]
        with pytest.raises(EnqueueError, match="no ordering_key or dedupe_key") as refused:
            await enqueue_many(await h.target(), specs)
        assert refused.value.option == "dedupe_key"
        assert await claimable(h) == [parent], "nothing of the batch was written"

    on_store(test)


def test_bad_graphs_are_refused_before_anything_is_sent() -> None:
    wf = Workflow()
    wf.add("a", "t")
    with pytest.raises(EnqueueError, match="no step added before it"):
        wf.add("b", "t", after=["later"])
    with pytest.raises(EnqueueError, match="added already"):
        wf.add("a", "t")
    with pytest.raises(EnqueueError, match="on_parent_failure"):
        wf.add("c", "t", after=["a"], on_parent_failure="retry")  # type: ignore[arg-type]
    with pytest.raises(EnqueueError, match="ordering_key"):
        wf.add("d", JobSpec("t", ordering_key="k"), after=["a"]) and wf.graph()
    with pytest.raises(EnqueueError, match="must be an integer"):
        wf.add("e", "t", after=[1.5])  # type: ignore[list-item]


def test_an_operator_cancel_of_a_blocked_job_cancels_its_dependents(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        parent = await h.enqueue("a")
        child = await h.enqueue("b", depends_on=[parent])
        grandchild = await h.enqueue("c", depends_on=[child])
        assert child is not None and grandchild is not None
        await h.cancel([child])
        assert await status(h, child) == STATUS_CANCELLED
        assert await status(h, grandchild) == STATUS_CANCELLED
        job = await claim_one(h)
        await h.store.jobs_complete([job.id], [job.token])
        assert await status(h, child) == STATUS_CANCELLED, "a cancelled child stays cancelled"

    on_store(test)


def test_a_batch_callback_runs_once_after_every_member_with_their_counts(
    on_store_completing: Run,
) -> None:
    async def test(h: Harness) -> None:
        batch = await enqueue_batch(
            await h.target(),
            [JobSpec("member", {"n": n}) for n in range(4)],
            JobSpec("report", {"to": "ops"}),
        )
        assert len(batch.job_ids) == 4
        assert await status(h, batch.batch_id) == STATUS_BLOCKED
        jobs = (await h.store.jobs_claim("default", 10, 30.0, None)).jobs
        assert sorted(j.id for j in jobs) == batch.job_ids
        first, second, third, fourth = sorted(jobs, key=lambda j: j.id)
        await h.store.jobs_complete([first.id, second.id], [first.token, second.token])
        await h.store.jobs_fail_owned([Failure(third.id, third.token, FAILED)])
        assert await status(h, batch.batch_id) == STATUS_BLOCKED
        await h.store.jobs_cancel([fourth.id])  # a request: it ends when its owner writes it
        await h.store.jobs_fail_owned(
            [Failure(fourth.id, fourth.token, Outcome(STATUS_CANCELLED, 0.0, "cancelled"))]
        )
        assert await claimable(h) == [batch.batch_id]
        state = await h.store.job_get(batch.batch_id)
        assert state is not None
        payload = state.payload if isinstance(state.payload, dict) else orjson.loads(state.payload)
        assert payload == {
            "to": "ops",
            "batch": {
                "id": batch.batch_id,
                "counts": {"completed": 2, "failed": 1, "discarded": 0, "cancelled": 1},
            },
        }
        member = await h.store.job_get(batch.job_ids[0])
        if h.completed_jobs == "keep":
            assert member is not None and member.batch_id == batch.batch_id
            assert member.status == STATUS_COMPLETED

    on_store_completing(test)


def test_an_empty_batch_runs_its_callback_at_once(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        batch = await enqueue_batch(await h.target(), [], JobSpec("report"))
        assert batch.job_ids == []
        assert await claimable(h) == [batch.batch_id]

    on_store(test)
