"""What running handlers report (Job.set_progress, Job.update_meta), as the store writes it
(jobs_report_progress): the same assertions against PostgreSQL and the in-memory store
(tests/contract/test_store_contract.py). A report is an owner's write, fenced by the claim's
token: the right token writes, another token or a finished job writes nothing."""

from __future__ import annotations

from typing import Any

import orjson

from dispatcher.db.progress import ProgressReport
from dispatcher.db.rows import Failure
from dispatcher.job_reports import STORED_META_BYTES
from dispatcher.model import STATUS_COMPLETED, Job
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


def report(job: Job, progress: Any = None, meta: dict[str, Any] | None = None) -> ProgressReport:
    """What the worker's coalescer sends for `job` (None: nothing of that kind reported)."""
    return ProgressReport(
        job.id,
        job.token,
        job.bucket,
        None if progress is None else orjson.dumps(progress).decode(),
        None if meta is None else orjson.dumps(meta).decode(),
    )


def test_the_owners_reports_are_written_progress_replaced_and_meta_merged_key_by_key(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("import", {"file": "a.csv"})
        job = await claim_one(h)
        other_id = await h.enqueue("import", {"file": "b.csv"})  # queued: never reports
        written = await h.store.jobs_report_progress(
            [report(job, {"done": 1, "total": 4}, {"source": "s3", "rows": 10})]
        )
        assert [(w.id, w.meta_refused) for w in written] == [(job_id, False)]
        # Progress only: the meta stays; meta only: the progress stays, keys merged in.
        await h.store.jobs_report_progress([report(job, {"done": 3, "total": 4})])
        await h.store.jobs_report_progress([report(job, meta={"rows": 30, "nested": {"a": [1]}})])
        state = await h.store.job_get(job_id)
        assert state is not None
        assert state.progress == {"done": 3, "total": 4}
        assert state.meta == {"source": "s3", "rows": 30, "nested": {"a": [1]}}
        # A plain number, and a shallow merge: a nested dict given replaces the one stored.
        await h.store.jobs_report_progress([report(job, 100, {"nested": {"b": 2}})])
        state = await h.store.job_get(job_id)
        assert state is not None and state.progress == 100
        assert state.meta == {"source": "s3", "rows": 30, "nested": {"b": 2}}
        assert state.status == "running" and state.attempts == 1, "nothing else changed"
        untouched = await h.store.job_get(other_id)
        assert untouched is not None and (untouched.progress, untouched.meta) == (None, None)

    on_store(test)


def test_another_token_writes_nothing(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("import")
        job = await claim_one(h)
        await h.store.jobs_report_progress([report(job, 10, {"a": 1})])
        stranger = Job(job.id, "import", None, 1, None, None, job.bucket, 0, None, OTHER_TOKEN)
        written = await h.store.jobs_report_progress([report(stranger, 99, {"a": 2, "b": 3})])
        assert written == []
        state = await h.store.job_get(job_id)
        assert state is not None and (state.progress, state.meta) == (10, {"a": 1})

    on_store(test)


def test_a_job_reaped_and_claimed_again_keeps_only_its_new_owners_reports(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("import")
        first = await claim_one(h)
        await h.expire_lease(job_id)
        assert [e.id for e in await h.store.jobs_lease_expired()] == [job_id]
        assert await h.store.jobs_fail_owned(
            [Failure(first.id, first.token, retry(0.0))], lease_expired=True
        ), "reaped: queued again"
        await h.make_due(job_id)
        second = await claim_one(h)
        assert second.id == job_id and second.token != first.token
        batch = [report(first, 50, {"owner": "first"}), report(second, 5, {"owner": "second"})]
        written = await h.store.jobs_report_progress(batch)
        assert [w.id for w in written] == [job_id]
        state = await h.store.job_get(job_id)
        assert state is not None and (state.progress, state.meta) == (5, {"owner": "second"})

    on_store(test)


def test_a_finished_job_keeps_what_it_had(on_store_completing: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("import")
        job = await claim_one(h)
        await h.store.jobs_report_progress([report(job, 100, {"rows": 3})])
        assert (await h.store.jobs_complete([job.id], [job.token])).completed == 1
        written = await h.store.jobs_report_progress([report(job, 0, {"rows": 0})])
        assert written == [], "its own token, but the job is no longer running"
        state = await h.store.job_get(job_id)
        if h.completed_jobs == "delete":
            assert state is None
        else:
            assert state is not None and state.status == STATUS_COMPLETED
            assert (state.progress, state.meta) == (100, {"rows": 3})

    on_store_completing(test)


def test_a_merge_past_the_stored_bound_is_refused_and_the_progress_still_written(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("import")
        job = await claim_one(h)
        chunk = "x" * (STORED_META_BYTES // 3)
        for n in (1, 2):
            [written] = await h.store.jobs_report_progress([report(job, n, {f"k{n}": chunk})])
            assert not written.meta_refused
        [written] = await h.store.jobs_report_progress([report(job, 3, {"k3": chunk})])
        assert written.meta_refused
        state = await h.store.job_get(job_id)
        assert state is not None and state.progress == 3
        assert state.meta == {"k1": chunk, "k2": chunk}
        # A key replaced in place does not grow it: that merge is made.
        [written] = await h.store.jobs_report_progress([report(job, meta={"k1": "short"})])
        assert not written.meta_refused
        state = await h.store.job_get(job_id)
        assert state is not None and state.meta == {"k1": "short", "k2": chunk}

    on_store(test)
