"""Ordering keys in the store contract: the same assertions against PostgreSQL (JobStore) and the
in-memory store. Jobs of a queue that share a key are claimable one at a time, in id order; a
retry holds the key; a final failure halts it or lets the next job go, as the Failure says."""

from __future__ import annotations

from typing import Any

from dispatcher.db.rows import Failure
from dispatcher.model import (
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    STATUS_WAITING,
    Outcome,
)
from dispatcher.runtime.maintenance import Reaper
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.sections import MaintenanceSettings
from tests.contract.store_support import Harness
from tests.contract.test_store_contract import Run, on_store, on_store_completing, retry

__all__ = ["on_store", "on_store_completing"]  # fixtures, used by name

FAIL_FOR_GOOD = Outcome(STATUS_FAILED, 0.0, "boom")


async def claim_all(h: Harness, limit: int = 100) -> list[Any]:
    return (await h.store.jobs_claim("default", limit, 30.0, None)).jobs


async def status(h: Harness, job_id: int) -> str:
    state = await h.store.job_get(job_id)
    assert state is not None
    return state.status


def test_a_keys_jobs_are_claimable_one_at_a_time_in_id_order_under_either_completion(
    on_store_completing: Run,
) -> None:
    async def test(h: Harness) -> None:
        a = [await h.enqueue("send", {"n": n}, ordering_key="customer:42") for n in range(4)]
        b = [
            await h.enqueue("send", {"n": n}, ordering_key="customer:7", priority=-1)
            for n in range(2)
        ]
        free = await h.enqueue("send", {"free": True})
        assert [await status(h, i) for i in a] == [STATUS_QUEUED] + [STATUS_WAITING] * 3
        jobs = (await h.store.jobs_claim("default", 1, 30.0, None)).jobs
        assert [j.id for j in jobs] == [b[0]], "priority orders jobs between keys"
        order: list[int] = []
        while True:
            jobs += await claim_all(h)
            if not jobs:
                break
            keys = [j.ordering_key for j in jobs if j.ordering_key is not None]
            assert len(keys) == len(set(keys)), f"two jobs of one key claimed at once: {jobs}"
            order += [j.id for j in jobs]
            assert await claim_all(h) == [], "nothing else is claimable while the holders run"
            assert (
                await h.store.jobs_complete(
                    [j.id for j in jobs], [j.token for j in jobs], keyed=bool(keys)
                )
            ).completed == len(jobs)
            jobs = []
        assert (
            [i for i in order if i in a] == a
            and [i for i in order if i in b] == b
            and free in order
        )
        for job_id in a + b:
            state = await h.store.job_get(job_id)
            assert (
                state is None
                if h.completed_jobs == "delete"
                else state and state.status == STATUS_COMPLETED
            )

    on_store_completing(test)


def test_a_retry_holds_its_key_and_the_same_job_runs_again_before_the_next(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        first = await h.enqueue("send", ordering_key="k", max_attempts=3)
        second = await h.enqueue("send", ordering_key="k")
        (job,) = await claim_all(h)
        assert job.id == first and job.ordering_key == "k"
        written = await h.store.jobs_fail_owned([Failure(first, job.token, retry(0.0))])
        assert [w.status for w in written] == [STATUS_QUEUED]
        await h.make_due(first)
        (again,) = await claim_all(h)
        assert (again.id, again.attempts) == (first, 2), "the retry, not the next job"
        assert await status(h, second) == STATUS_WAITING
        assert (await h.store.jobs_complete([first], [again.token], keyed=True)).completed == 1
        assert [j.id for j in await claim_all(h)] == [second]

    on_store(test)


def test_a_final_failure_halts_its_key_unless_its_handler_continues(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        halted = [await h.enqueue("send", ordering_key="halt", max_attempts=1) for _ in range(2)]
        going = [await h.enqueue("send", ordering_key="go", max_attempts=1) for _ in range(2)]
        jobs = {j.id: j for j in await claim_all(h)}
        assert set(jobs) == {halted[0], going[0]}
        written = await h.store.jobs_fail_owned(
            [
                Failure(halted[0], jobs[halted[0]].token, FAIL_FOR_GOOD, halts=True),
                Failure(going[0], jobs[going[0]].token, FAIL_FOR_GOOD, halts=False),
            ]
        )
        assert {w.id: w.ordering_halted for w in written} == {halted[0]: True, going[0]: False}
        assert [j.id for j in await claim_all(h)] == [going[1]], (
            "only the continuing key's next job"
        )
        state = await h.store.job_get(halted[0])
        assert state is not None and (state.status, state.ordering_halted, state.ordering_key) == (
            STATUS_FAILED,
            True,
            "halt",
        )
        assert await status(h, halted[1]) == STATUS_WAITING

    on_store(test)


def test_a_keyed_job_whose_lease_ran_out_runs_again_before_its_keys_next_job(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        settings = MaintenanceSettings(
            reaper_interval_s=1.0, history=False, table_sample_interval_s=15.0
        )
        reaper = Reaper(
            h.store,
            RetryPolicy(1.0, 60.0, rand=lambda: 0.0),
            settings,  # type: ignore[arg-type]
            on_reaped=lambda: None,
        )
        first = await h.enqueue("send", ordering_key="k", max_attempts=5)
        second = await h.enqueue("send", ordering_key="k")
        (old,) = (await h.store.jobs_claim("default", 10, 5.0, None)).jobs
        await h.expire_lease(first)
        await reaper.tick()
        assert await status(h, first) == STATUS_QUEUED and await status(h, second) == STATUS_WAITING
        await h.make_due(first)
        (new,) = await claim_all(h)
        assert new.id == first and new.token != old.token
        assert (await h.store.jobs_complete([first], [old.token], keyed=True)).completed == 0, (
            "the stale run: fenced"
        )
        assert await status(h, second) == STATUS_WAITING, "a fenced completion releases nothing"
        assert (await h.store.jobs_complete([first], [new.token], keyed=True)).completed == 1
        assert [j.id for j in await claim_all(h)] == [second]

    on_store(test)


def test_a_job_given_back_at_shutdown_keeps_its_key(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        first = await h.enqueue("send", ordering_key="k")
        second = await h.enqueue("send", ordering_key="k")
        (job,) = await claim_all(h)
        assert await h.store.jobs_release_owned([job]) == 1
        assert await status(h, first) == STATUS_QUEUED and await status(h, second) == STATUS_WAITING
        (again,) = await claim_all(h)
        assert again.id == first and await status(h, first) == STATUS_RUNNING

    on_store(test)


def test_a_cancelled_holder_or_waiting_job_lets_its_key_go_on_in_order(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        ids = [await h.enqueue("send", ordering_key="k") for _ in range(4)]
        assert await h.store.jobs_cancel([ids[2]]) == {ids[2]: "cancelled"}, (
            "a waiting job: at once"
        )
        assert await h.store.jobs_cancel([ids[0]]) == {ids[0]: "cancelled"}, (
            "the queued holder: at once"
        )
        (job,) = await claim_all(h)
        assert job.id == ids[1], "the next job of the key, not the cancelled one"
        assert (await h.store.jobs_complete([job.id], [job.token], keyed=True)).completed == 1
        assert [j.id for j in await claim_all(h)] == [ids[3]]

    on_store(test)
