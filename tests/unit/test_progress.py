"""Progress and metadata from inside a handler, without a server: the checks in the handler's
call (dispatcher/job_reports.py), the worker's coalescer on a fake clock and its flusher over the
in-memory store (dispatcher/runtime/progress.py), and dispatcher.testing's recording of them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher import Job, ProgressError, Registry, enqueue_sync
from dispatcher.job_reports import MAX_META_BYTES, MAX_PROGRESS_BYTES
from dispatcher.model import STATUS_COMPLETED
from dispatcher.runtime.progress import Coalescer, ProgressFlusher
from dispatcher.testing import (
    FakeClock,
    MemoryStore,
    Runner,
    aperform_job,
    perform_job,
    recorded_progress,
)
from tests.helpers import run_async


def job(job_id: int = 1, token: str = "t1") -> Job:
    return Job(job_id, "import", {}, 1, None, None, 0, 0, None, token)


# -- the coalescer, on a fake clock ----------------------------------------------------------------


def test_a_thousand_reports_between_two_batches_are_one_row_with_the_latest_of_each() -> None:
    clock = FakeClock()
    coalescer = Coalescer(1.0, clock)
    for n in range(1000):
        coalescer.set_progress(job(), {"done": n, "total": 999})
        coalescer.update_meta(job(), {f"k{n % 3}": n})
    coalescer.set_progress(job(2), 7)
    [first, second] = coalescer.take()
    assert first.report().progress == '{"done":999,"total":999}'
    assert first.report().meta == '{"k0":999,"k1":997,"k2":998}'
    assert (second.job.id, second.report().progress, second.report().meta) == (2, "7", None)
    assert coalescer.pending == 0 and coalescer.take() == []


def test_a_batch_goes_at_most_once_per_interval_however_often_handlers_report() -> None:
    clock = FakeClock()
    coalescer = Coalescer(1.0, clock)
    coalescer.set_progress(job(), 1)
    assert len(coalescer.take()) == 1, "the first report after a quiet spell goes at once"
    batches = 0
    for _ in range(40):  # 10 s of reports every 0.25 s (exact in binary: no rounding drift)
        clock.advance(0.25)
        coalescer.set_progress(job(), 2)
        batches += bool(coalescer.take())
    assert batches == 10
    clock.advance(0.5)
    coalescer.set_progress(job(), 3)
    assert coalescer.take() == [], "0.5 s after the last batch"
    clock.advance(0.5)
    [pending] = coalescer.take()
    assert pending.report().progress == "3"


def test_a_finishing_jobs_reports_are_taken_at_once_and_only_theirs() -> None:
    clock = FakeClock()
    coalescer = Coalescer(1.0, clock)
    coalescer.set_progress(job(1), 1)
    assert coalescer.take()  # a batch just went
    coalescer.set_progress(job(1), 100)
    coalescer.set_progress(job(2), 50)
    [finishing] = coalescer.take_jobs([1, 3])
    assert (finishing.job.id, finishing.report().progress) == (1, "100")
    assert coalescer.take() == [], "the interval still holds for the others"
    clock.advance(1.0)
    assert [p.job.id for p in coalescer.take()] == [2]
    assert coalescer.take_jobs([2]) == []


def test_a_new_claim_of_the_job_starts_its_reports_afresh() -> None:
    coalescer = Coalescer(1.0, FakeClock())
    coalescer.update_meta(job(token="old"), {"a": 1})
    coalescer.update_meta(job(token="new"), {"b": 2})
    [pending] = coalescer.take()
    assert (pending.job.token, pending.report().meta) == ("new", '{"b":2}')


def test_a_batch_not_written_is_kept_under_what_was_reported_since() -> None:
    clock = FakeClock()
    coalescer = Coalescer(1.0, clock)
    coalescer.set_progress(job(1), 1)
    coalescer.update_meta(job(1), {"a": 1, "b": 1})
    coalescer.set_progress(job(2), 5)
    batch = coalescer.take()
    coalescer.update_meta(job(1), {"b": 2})  # reported while the write failed
    coalescer.put_back(batch)
    clock.advance(1.0)
    reports = {p.job.id: p.report() for p in coalescer.take()}
    assert (reports[1].progress, reports[1].meta) == ("1", '{"a":1,"b":2}')
    assert reports[2].progress == "5"


def test_a_value_that_cannot_be_stored_raises_in_the_handler_and_nothing_is_kept() -> None:
    coalescer = Coalescer(1.0, FakeClock())
    with pytest.raises(ProgressError, match="over the limit"):
        coalescer.set_progress(job(), "x" * MAX_PROGRESS_BYTES)
    with pytest.raises(ProgressError, match="JSON"):
        coalescer.set_progress(job(), {1, 2})
    with pytest.raises(ProgressError, match="dict"):
        coalescer.update_meta(job(), ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(ProgressError, match="keys must be strings"):
        coalescer.update_meta(job(), {1: "x"})  # type: ignore[dict-item]
    assert coalescer.pending == 0
    coalescer.update_meta(job(), {"a": "x" * (MAX_META_BYTES // 2)})
    with pytest.raises(ProgressError, match="with the updates not written yet"):
        coalescer.update_meta(job(), {"b": "x" * (MAX_META_BYTES // 2)})
    [pending] = coalescer.take()
    assert pending.meta is not None and set(pending.meta) == {"a"}
    assert issubclass(ProgressError, ValueError)


def test_what_the_handler_passes_is_copied() -> None:
    coalescer = Coalescer(1.0, FakeClock())
    rows = {"rows": [1]}
    coalescer.update_meta(job(), rows)
    rows["rows"].append(2)
    [pending] = coalescer.take()
    assert pending.report().meta == '{"rows":[1]}'


# -- the flusher over the in-memory store ----------------------------------------------------------


def test_the_flusher_writes_one_batch_per_interval_and_a_finishing_jobs_last_report_first() -> None:
    async def test() -> None:
        clock = FakeClock()
        store = MemoryStore(clock)
        enqueue_sync(store, "import", {})
        [claimed] = store.claim("default", 1, 30.0).jobs
        flusher = ProgressFlusher(store, 1.0, clock=clock)  # type: ignore[arg-type]
        for n in range(500):
            flusher.set_progress(claimed, n)
        flusher.update_meta(claimed, {"rows": 500})
        assert await flusher.tick() == 1.0
        for n in range(500, 1000):
            flusher.set_progress(claimed, n)
        await flusher.tick()  # within the interval: nothing written
        assert flusher.stats.writes == 1
        state = store.get(claimed.id)
        assert state is not None and (state.progress, state.meta) == (499, {"rows": 500})
        await flusher.finishing([claimed.id])  # its outcome is about to be written
        store.complete([claimed.id], [claimed.token])
        state = store.get(claimed.id)
        assert state is not None and (state.status, state.progress) == (STATUS_COMPLETED, 999)
        assert (flusher.stats.writes, flusher.stats.written, flusher.stats.fenced) == (2, 2, 0)
        flusher.set_progress(claimed, 0)  # a report after its end: fenced, never written
        clock.advance(1.0)
        await flusher.tick()
        state = store.get(claimed.id)
        assert state is not None and state.progress == 999 and flusher.stats.fenced == 1

    run_async(test())


# -- outside a worker ------------------------------------------------------------------------------


def test_reporting_outside_a_handler_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match="inside a handler"):
        job().set_progress_sync(1)
    with pytest.raises(RuntimeError, match="inside a handler"):
        asyncio.run(job().update_meta({"a": 1}))


registry = Registry()


@registry.handler("import_async")
async def import_async(job: Job) -> None:
    total = job.payload["rows"]
    await job.update_meta({"source": job.payload["source"]})
    for done in range(total + 1):
        await job.set_progress({"done": done, "total": total})
    await job.update_meta({"rows": total})


@registry.handler("import_sync")
def import_sync(job: Job) -> None:
    job.set_progress_sync(50)
    job.update_meta_sync({"half": True})
    job.set_progress_sync(100)


@registry.handler("too_big")
async def too_big(job: Job) -> None:
    await job.set_progress("x" * MAX_PROGRESS_BYTES)


def test_perform_job_records_what_the_handler_reported() -> None:
    with recorded_progress() as reported:
        perform_job(registry, "import_async", {"rows": 2, "source": "s3"})
    assert reported.progress == {"done": 2, "total": 2}
    assert reported.values == [{"done": n, "total": 2} for n in range(3)]
    assert reported.meta == {"source": "s3", "rows": 2}
    with recorded_progress() as reported:
        perform_job(registry, "import_sync")
    assert (reported.values, reported.meta) == ([50, 100], {"half": True})
    perform_job(registry, "import_sync")  # nobody records: accepted all the same
    with pytest.raises(ProgressError):
        perform_job(registry, "too_big")

    async def in_a_loop() -> list[Any]:
        with recorded_progress() as reported:
            await aperform_job(registry, "import_sync")
            await aperform_job(registry, "import_async", {"rows": 1, "source": "x"})
        return reported.values

    assert run_async(in_a_loop()) == [50, 100, {"done": 0, "total": 1}, {"done": 1, "total": 1}]


def test_the_runner_writes_reports_into_its_store_as_jobs_show_would_read_them() -> None:
    store = MemoryStore()
    first = enqueue_sync(store, "import_async", {"rows": 3, "source": "s3"})
    second = enqueue_sync(store, "import_sync", {})
    failing = enqueue_sync(store, "too_big", {}, max_attempts=1)
    attempts = Runner(store, registry).drain()
    assert [a.status for a in attempts] == ["completed", "completed", "failed"]
    one, two, three = store.get(first), store.get(second), store.get(failing)
    assert one is not None and two is not None and three is not None
    assert (one.progress, one.meta) == ({"done": 3, "total": 3}, {"source": "s3", "rows": 3})
    assert (two.progress, two.meta) == (100, {"half": True})
    assert (three.progress, three.meta) == (None, None)
    assert "ProgressError" in (three.last_error or "")
