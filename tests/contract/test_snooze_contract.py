"""Snoozes, max_attempts not given at enqueue, and completions that answer which ids they
refused: the same assertions against PostgreSQL and the in-memory store
(tests/contract/test_store_contract.py)."""

from __future__ import annotations

from datetime import timedelta

from dispatcher import Registry
from dispatcher.constants import COMPLETED_DELETE
from dispatcher.db.rows import Failure
from dispatcher.model import STATUS_CANCELLED, STATUS_FAILED, STATUS_QUEUED, STATUS_WAITING, Outcome
from dispatcher.runtime.maintenance import Reaper
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.sections import MaintenanceSettings
from tests.contract.store_support import Harness
from tests.contract.test_store_contract import (
    OTHER_TOKEN,
    Run,
    claim_one,
    on_store,
    on_store_completing,
    retry,
)

__all__ = ["on_store", "on_store_completing"]  # fixtures, used by name

FAILED = Outcome(
    STATUS_FAILED, 0.0, "snoozed 2 times (DISPATCHER_MAX_SNOOZES), and again: snoozed for 60 s"
)


def snooze(
    job_id: int, token: str, seconds: float, cap: int, fallback: Outcome = FAILED
) -> Failure:
    """What the executor sends for `raise Snooze(seconds)`: the snooze, and the failure it
    becomes past `cap`."""
    return Failure(job_id, token, fallback, snooze=(seconds, cap))


def test_a_snooze_queues_the_job_again_later_gives_its_attempt_back_and_keeps_its_last_error(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send", max_attempts=1)
        job = await claim_one(h)
        failed = await h.store.jobs_fail_owned(
            [Failure(job_id, job.token, retry(0.0, "first error"))]
        )
        assert [w.snoozed for w in failed] == [False]
        await h.make_due(job_id)
        job = await claim_one(h)
        assert job.attempts == 2
        before = await h.now()
        [written] = await h.store.jobs_fail_owned([snooze(job_id, job.token, 60.0, 2)])
        after = await h.now()
        assert (written.status, written.snoozed, written.attempts) == (STATUS_QUEUED, True, 1)
        state = await h.store.job_get(job_id)
        assert state is not None
        assert (state.status, state.attempts, state.snoozes, state.last_error) == (
            STATUS_QUEUED,
            1,
            1,
            "first error",
        )
        assert state.failed_at is None
        assert before + timedelta(seconds=60) <= state.run_at <= after + timedelta(seconds=60), (
            "due 60 s later"
        )
        assert (await h.store.jobs_claim("default", 1, 30.0, None)).jobs == [], "not due yet"

    on_store(test)


def test_past_the_cap_a_snooze_is_written_as_the_failed_attempt_it_became(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        for n in (1, 2):
            job = await claim_one(h)
            [written] = await h.store.jobs_fail_owned([snooze(job_id, job.token, 0.0, 2)])
            assert (written.snoozed, written.attempts) == (True, 0), f"snooze {n} of 2"
            await h.make_due(job_id)
        job = await claim_one(h)
        [written] = await h.store.jobs_fail_owned([snooze(job_id, job.token, 0.0, 2)])
        assert (written.status, written.snoozed, written.attempts) == (STATUS_FAILED, False, 1)
        state = await h.store.job_get(job_id)
        assert state is not None and (state.status, state.snoozes, state.last_error) == (
            STATUS_FAILED,
            3,
            FAILED.error,
        )
        assert state.failed_at is not None

    on_store(test)


def test_a_snoozed_keyed_job_keeps_holding_its_key(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        first = await h.enqueue("send", ordering_key="k")
        second = await h.enqueue("send", ordering_key="k")
        job = await claim_one(h)
        assert job.id == first
        [written] = await h.store.jobs_fail_owned([snooze(first, job.token, 0.0, 5)])
        assert written.snoozed
        state = await h.store.job_get(second)
        assert state is not None and state.status == STATUS_WAITING, (
            "the snoozed job still holds the key"
        )
        await h.make_due(first)
        assert (await claim_one(h)).id == first

    on_store(test)


def test_a_snooze_of_a_job_an_operator_asked_to_cancel_ends_it_cancelled(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        job = await claim_one(h)
        assert await h.store.jobs_cancel([job_id]) == {job_id: "running"}
        [written] = await h.store.jobs_fail_owned([snooze(job_id, job.token, 30.0, 5)])
        assert (written.status, written.snoozed) == (STATUS_CANCELLED, False)

    on_store(test)


def test_a_snooze_by_a_token_that_does_not_own_the_job_changes_nothing(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        await claim_one(h)
        assert await h.store.jobs_fail_owned([snooze(job_id, OTHER_TOKEN, 0.0, 5)]) == []
        state = await h.store.job_get(job_id)
        assert state is not None and (state.attempts, state.snoozes) == (1, 0)

    on_store(test)


def test_a_completion_answers_the_ids_it_refused(on_store_completing: Run) -> None:
    async def test(h: Harness) -> None:
        ids = [await h.enqueue("send") for _ in range(3)]
        jobs = (await h.store.jobs_claim("default", 3, 30.0, None)).jobs
        tokens = {j.id: j.token for j in jobs}
        tokens[ids[1]] = OTHER_TOKEN  # taken over: another claim's token
        assert (await h.store.jobs_complete(ids, [tokens[i] for i in ids])).fenced == [ids[1]]
        assert (await h.store.jobs_complete(ids[:1], [tokens[ids[0]]])).fenced == ids[:1], (
            "finished: refused"
        )
        keyed = await h.enqueue("send", ordering_key="k")
        job = await claim_one(h)
        assert job.id == keyed
        assert (await h.store.jobs_complete([keyed], [job.token], keyed=True)).fenced == []
        state = await h.store.job_get(keyed)
        assert (state is None) == (h.completed_jobs == COMPLETED_DELETE)

    on_store_completing(test)


def test_max_attempts_not_given_at_enqueue_is_stored_as_none(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        given = await h.enqueue("send", max_attempts=3)
        state = await h.store.job_get(job_id)
        assert state is not None and state.max_attempts is None
        jobs = {j.id: j for j in (await h.store.jobs_claim("default", 2, 30.0, None)).jobs}
        assert (jobs[job_id].max_attempts, jobs[given].max_attempts) == (None, 3)
        await h.expire_lease(job_id)
        expired = {e.id: e.max_attempts for e in await h.store.jobs_lease_expired()}
        assert expired[job_id] is None

    on_store(test)


def test_the_reaper_applies_the_handlers_retry_settings(on_store: Run) -> None:
    """A job enqueued without max_attempts whose worker died: its handler's limit and delays
    decide."""

    async def test(h: Harness) -> None:
        registry = Registry()
        registry.handler("send", max_attempts=2, retry=lambda attempt, error: 120.0)(
            lambda job: None
        )
        settings = MaintenanceSettings(
            reaper_interval_s=1.0, history=False, table_sample_interval_s=15.0
        )
        reaper = Reaper(
            h.store,
            RetryPolicy(1.0, 60.0),
            settings,
            on_reaped=lambda: None,  # type: ignore[arg-type]
            halts=registry.halts,
            retry_of=registry.retry_of,
        )
        job_id = await h.enqueue("send")
        for status in (STATUS_QUEUED, STATUS_FAILED):
            await claim_one(h, lease_s=5.0)
            await h.expire_lease(job_id)
            before = await h.now()
            await reaper.tick()
            state = await h.store.job_get(job_id)
            assert state is not None and state.status == status
            if status == STATUS_QUEUED:
                assert state.run_at >= before + timedelta(seconds=120), "the handler's retry= delay"
                await h.make_due(job_id)

    on_store(test)
