"""Every failed attempt's error on its job (`errors`, migration 0015): written by each failure but
a snooze within its cap, bounded, never by a success. The same assertions against PostgreSQL and
the in-memory store (tests/contract/test_store_contract.py)."""

from __future__ import annotations

from dispatcher.constants import ATTEMPT_ERRORS_KEPT, LAST_ERROR_MAX_CHARS
from dispatcher.db.rows import Failure
from dispatcher.model import STATUS_COMPLETED, STATUS_FAILED, Outcome
from tests.contract.store_support import Harness
from tests.contract.test_store_contract import Run, claim_one, on_store, retry

__all__ = ["on_store"]  # a fixture, used by name


async def fail_once(h: Harness, job_id: int, outcome: Outcome) -> None:
    job = await claim_one(h)
    await h.store.jobs_fail_owned([Failure(job_id, job.token, outcome)])
    await h.make_due(job_id)


def test_each_failed_attempt_leaves_its_error_and_a_snooze_leaves_none(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send", max_attempts=3)
        await fail_once(h, job_id, retry(0.0, "first"))
        job = await claim_one(h)  # a snooze within its cap is not an error
        await h.store.jobs_fail_owned(
            [Failure(job_id, job.token, retry(0.0, "unused"), snooze=(0.0, 5))]
        )
        await h.make_due(job_id)
        await fail_once(h, job_id, retry(0.0, "second"))
        await fail_once(h, job_id, Outcome(STATUS_FAILED, 0.0, "third"))
        state = await h.store.job_get(job_id)
        assert state is not None and state.status == STATUS_FAILED
        assert [(e["attempt"], e["error"]) for e in state.errors or []] == [
            (1, "first"),
            (2, "second"),
            (3, "third"),
        ]
        assert all(isinstance(e["at"], str) and e["at"] for e in state.errors or [])
        assert state.last_error == "third"

    on_store(test)


def test_a_job_that_succeeds_has_no_errors_and_one_that_failed_first_keeps_them(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        clean = await h.enqueue("send")
        job = await claim_one(h)
        await h.store.jobs_complete([clean], [job.token])
        flaky = await h.enqueue("send")
        await fail_once(h, flaky, retry(0.0, "once"))
        job = await claim_one(h)
        await h.store.jobs_complete([flaky], [job.token])
        for job_id, errors in ((clean, None), (flaky, ["once"])):
            state = await h.store.job_get(job_id)
            if state is None:  # DISPATCHER_COMPLETED_JOBS=delete: nothing left to show
                continue
            assert state.status == STATUS_COMPLETED
            got = None if state.errors is None else [e["error"] for e in state.errors]
            assert got == errors

    on_store(test)


def test_the_newest_errors_are_kept_and_a_long_one_keeps_its_head_and_tail(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send", max_attempts=100)
        failures = ATTEMPT_ERRORS_KEPT + 5
        for n in range(1, failures):
            await fail_once(h, job_id, retry(0.0, f"error {n}"))
        long = "HEAD" + "x" * (3 * LAST_ERROR_MAX_CHARS) + "TAIL: ValueError"
        await fail_once(h, job_id, retry(0.0, long))
        state = await h.store.job_get(job_id)
        assert state is not None and state.errors is not None
        assert [e["attempt"] for e in state.errors] == list(
            range(failures - ATTEMPT_ERRORS_KEPT + 1, failures + 1)
        )
        cut = state.errors[-1]["error"]
        assert cut.startswith("HEAD") and cut.endswith("TAIL: ValueError") and " [...] " in cut
        assert len(cut) == LAST_ERROR_MAX_CHARS

    on_store(test)
