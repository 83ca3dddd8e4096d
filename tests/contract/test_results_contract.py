"""Results: a completion's return value stored with its job, fenced like the completion, kept under
DISPATCHER_COMPLETED_JOBS=delete, and read back by JobHandle.result; the same assertions against
PostgreSQL and the in-memory store (tests/contract/test_store_contract.py)."""

from __future__ import annotations

import pytest

from dispatcher import JobFailed, JobHandle, JobNotFound
from dispatcher.db.rows import Failure, ResultText
from dispatcher.model import STATUS_COMPLETED, STATUS_DISCARDED, Outcome
from dispatcher.runtime.results import encode_result
from tests.contract.store_support import Harness
from tests.contract.test_store_contract import (
    OTHER_TOKEN,
    Run,
    claim_one,
    on_store,
    on_store_completing,
)

__all__ = ["on_store", "on_store_completing"]  # fixtures, used by name


def test_a_result_is_stored_with_its_job_and_kept_whatever_completed_jobs_says(
    on_store_completing: Run,
) -> None:
    async def test(h: Harness) -> None:
        with_result = await h.enqueue("report")
        without = await h.enqueue("report")
        assert isinstance(with_result, JobHandle) and without is not None
        jobs = {j.id: j for j in (await h.store.jobs_claim("default", 2, 30.0, None)).jobs}
        a, b = jobs[with_result], jobs[without]
        done = await h.store.jobs_complete(
            [a.id], [a.token], results=[ResultText('{"rows": 3, "url": "s3://x"}', None)]
        )
        assert done.completed == 1
        await h.store.jobs_complete([b.id], [b.token])
        state = await h.store.job_get(with_result)
        assert state is not None and state.status == STATUS_COMPLETED
        assert state.result == {"rows": 3, "url": "s3://x"}
        assert await with_result.result(timeout=5, using=await h.target()) == {
            "rows": 3,
            "url": "s3://x",
        }
        plain = await h.store.job_get(without)
        if h.completed_jobs == "delete":
            assert plain is None, "a job without a result is deleted as before"
        else:
            assert plain is not None and plain.result is None

    on_store_completing(test)


def test_a_result_written_with_a_stale_token_is_not_stored(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("report")
        job = await claim_one(h)
        done = await h.store.jobs_complete(
            [job.id], [OTHER_TOKEN], results=[ResultText('"mine"', None)]
        )
        assert done.fenced == [job.id]
        state = await h.store.job_get(job.id)
        assert state is not None and state.result is None and state.status == "running"
        assert job_id == job.id

    on_store(test)


def test_a_result_that_could_not_be_stored_leaves_its_reason_and_completes(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("report")
        job = await claim_one(h)
        await h.store.jobs_complete(
            [job.id], [job.token], results=[encode_result(job.id, "x" * 100, 10)]
        )
        state = await h.store.job_get(job.id)
        assert state is not None and (state.status, state.result) == (STATUS_COMPLETED, None)
        assert "result not stored: 102 bytes of JSON" in (state.last_error or "")
        assert job_id is not None

    on_store(test)


def test_awaiting_a_job_that_failed_raises_its_error_and_a_missing_one_is_not_found(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        handle = await h.enqueue("report")
        assert isinstance(handle, JobHandle)
        job = await claim_one(h)
        await h.store.jobs_fail_owned(
            [Failure(job.id, job.token, Outcome(STATUS_DISCARDED, 0.0, "no such customer"))]
        )
        with pytest.raises(JobFailed, match="ended discarded: no such customer") as failed:
            await handle.result(timeout=5, using=await h.target())
        assert (failed.value.job_id, failed.value.status) == (job.id, STATUS_DISCARDED)
        with pytest.raises(JobNotFound):
            await JobHandle(987654).result(timeout=5, using=await h.target())
        pending = await h.enqueue("report")
        assert isinstance(pending, JobHandle)
        with pytest.raises(TimeoutError):
            await pending.result(timeout=0.2, using=await h.target())

    on_store(test)


def test_encoding_bounds_and_refuses_what_json_cannot_hold() -> None:
    assert encode_result(1, {"a": [1, 2]}, 100) == ResultText('{"a":[1,2]}', None)
    assert encode_result(1, {1: "x"}, 100).text == '{"1":"x"}'
    text, why = encode_result(1, object(), 100)
    assert text is None and why is not None and "JSON cannot hold" in why
    text, why = encode_result(1, "a\x00b", 100)
    assert text is None and why is not None and "NUL" in why


def test_the_wait_listens_on_the_channel_the_statements_notify() -> None:
    from dispatcher.constants import RESULTS_CHANNEL
    from dispatcher.db.queries import query

    assert query("results_listen").split()[-1] == RESULTS_CHANNEL
    assert query("results_unlisten").split()[-1] == RESULTS_CHANNEL
