"""The completer with a fake store: batching, fencing counts, and nothing lost on a store error."""

import asyncio

import pytest

from dispatcher.db.rows import Completion, FailedWrite
from dispatcher.errors import StoreUnavailable
from dispatcher.model import Job, Outcome
from dispatcher.runtime.completer import Completer
from dispatcher.settings.sections import CompletionSettings
from tests.helpers import run_async, wait_until_async


def job(
    job_id: int, attempts: int = 1, ordering_key: str | None = None, job_type: str = "t"
) -> Job:
    return Job(
        id=job_id,
        job_type=job_type,
        payload={},
        attempts=attempts,
        max_attempts=5,
        locked_at=None,
        bucket=0,
        priority=0,
        ordering_key=ordering_key,
        token=f"00000000-0000-0000-0000-{job_id:012d}",
    )


class FakeStore:
    worker_id = "w1"

    def __init__(self) -> None:
        self.completed: list[tuple[list[int], list[str]]] = []
        self.failed: list[list[tuple[int, str]]] = []
        self.history: list[tuple[list[int], list[str], list[str]]] = []
        # per completion statement: did it promote ordering keys' next jobs
        self.keyed: list[bool] = []
        self.fence: set[int] = set()  # ids whose token "changed": their writes are dropped
        # ids past DISPATCHER_MAX_SNOOZES: a snooze is written as the failure
        self.over: set[int] = set()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("complete: database unavailable")

    async def jobs_complete(self, ids, tokens, *, keyed=False, chain=None, buckets=None):
        self._check()
        self.completed.append((list(ids), list(tokens)))
        self.keyed.append(keyed)
        fenced = [i for i in ids if i in self.fence]
        return Completion(len(ids) - len(fenced), fenced)

    async def jobs_fail_owned(self, failures, *, lease_expired=False):
        self._check()
        self.failed.append([(f.id, f.outcome.status) for f in failures])
        return [
            FailedWrite(
                f.id,
                f.outcome.status,
                1,
                "w1",
                None,
                snoozed=f.snooze is not None and f.id not in self.over,
            )
            for f in failures
            if f.id not in self.fence
        ]

    async def history_record(self, rows):
        self._check()
        self.history.append((list(rows.ids), list(rows.workers), list(rows.outcomes)))


def make(store, **kw):
    return Completer(
        store,
        CompletionSettings(
            flush_interval_s=kw.pop("flush_interval_s", 10.0),
            flush_max=kw.pop("flush_max", 1000),
            history=kw.pop("history", False),
        ),
        **kw,
    )


def test_one_statement_per_kind_per_flush_and_fenced_rows_are_counted_not_errors():
    store = FakeStore()
    store.fence = {2}
    completer = make(store)
    for i in (1, 2, 3):
        completer.completed(job(i), 0.01)
    completer.failed(job(4), Outcome("queued", 1.0, "boom"), 0.01)
    completer.failed(job(5), Outcome("failed", 0.0, "boom"), 0.01)
    run_async(completer.flush())
    assert store.completed == [([1, 2, 3], [job(i).token for i in (1, 2, 3)])]
    assert store.failed == [[(4, "queued"), (5, "failed")]]
    assert (completer.stats.completed, completer.stats.fenced) == (2, 1)
    assert (completer.stats.retried, completer.stats.failed, completer.stats.discarded) == (1, 1, 0)
    assert completer.pending == 0


def test_a_store_error_keeps_every_outcome_in_order_for_the_next_flush():
    store = FakeStore()
    completer = make(store, history=True)
    completer.completed(job(1), 0.01)
    completer.failed(job(2), Outcome("queued", 1.0, "boom"), 0.01)
    store.down = True
    with pytest.raises(StoreUnavailable):
        run_async(completer.flush())
    assert completer.pending == 2
    completer.completed(job(3), 0.01)  # arrives while the database is away
    store.down = False
    run_async(completer.flush())
    assert store.completed == [([1, 3], [job(1).token, job(3).token])]
    assert store.failed == [[(2, "queued")]]
    assert store.history == [([1, 3, 2], ["w1"] * 3, ["completed", "completed", "retried"])]


def test_a_full_buffer_flushes_without_waiting_for_the_interval():
    store = FakeStore()
    completer = make(store, flush_interval_s=30.0, flush_max=3)

    async def main():
        task = asyncio.create_task(completer.run())
        try:
            for i in range(3):
                completer.completed(job(i), 0.0)
            await wait_until_async(
                lambda: store.completed, 5, "a flush of the full buffer", interval_s=0.01
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run_async(main())
    assert store.completed and store.completed[0][0] == [0, 1, 2]


def test_history_is_only_written_when_enabled():
    store = FakeStore()
    completer = make(store)
    completer.completed(job(1), 0.01)
    run_async(completer.flush())
    assert store.history == []


def test_a_cancelled_attempt_is_counted_as_cancelled_and_recorded_as_such_in_history():
    store = FakeStore()
    completer = make(store, history=True)
    completer.failed(job(1), Outcome("cancelled", 0.0, "cancelled: an operator asked"), 0.01)
    completer.failed(job(2), Outcome("discarded", 0.0, "bad"), 0.01)
    run_async(completer.flush())
    assert store.failed == [[(1, "cancelled"), (2, "discarded")]]
    assert store.history[0][2] == ["cancelled", "discarded"]
    assert (completer.stats.cancelled, completer.stats.discarded, completer.stats.failed) == (
        1,
        1,
        0,
    )


def test_a_keyed_completion_flushes_at_once_through_the_promoting_statement_and_others_do_not():
    """The next job of a key waits for its holder's completion to be written: no flush interval."""
    store = FakeStore()
    completer = make(store, flush_interval_s=30.0)

    async def main():
        task = asyncio.create_task(completer.run())
        try:
            completer.completed(job(1), 0.0)
            completer.completed(job(2, ordering_key="k"), 0.0)
            await wait_until_async(
                lambda: store.completed, 5, "a flush without the interval", interval_s=0.01
            )
            completer.completed(job(3), 0.0)
            await completer.flush()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run_async(main())
    assert [ids for ids, _ in store.completed] == [[1, 2], [3]]
    assert store.keyed == [True, False], "only a batch holding a keyed job pays for promotion"


@pytest.mark.parametrize("urgent", [frozenset({"capped"}), frozenset({"*"})])
def test_an_outcome_of_a_type_under_max_running_is_written_at_once_and_reported(urgent):
    """A gated claim waits for the slot it frees (flow control): no flush interval, and whoever
    waits is told once it is written. Other types wait for the interval as before."""
    store = FakeStore()
    told = []
    completer = make(
        store,
        flush_interval_s=30.0,
        urgent_types=urgent,
        written=lambda: told.append(len(store.completed)),
    )

    async def main():
        task = asyncio.create_task(completer.run())
        try:
            completer.completed(job(1, job_type="capped"), 0.0)
            await wait_until_async(
                lambda: store.completed and told, 5, "a flush without the interval", interval_s=0.01
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run_async(main())
    assert told == [1]


def test_a_keyed_batch_that_failed_to_write_is_still_keyed_when_retried():
    store = FakeStore()
    completer = make(store)
    completer.completed(job(1, ordering_key="k"), 0.0)
    store.down = True
    with pytest.raises(StoreUnavailable):
        run_async(completer.flush())
    store.down = False
    run_async(completer.flush())
    assert store.keyed == [True] and store.completed[0][0] == [1]


def test_only_attempts_whose_write_was_accepted_get_history_rows():
    """A completion or failure fenced by a changed token runs under another owner now: its history
    (and its outcome count) is that owner's to write."""
    store = FakeStore()
    store.fence = {2, 4}
    completer = make(store, history=True)
    for i in (1, 2):
        completer.completed(job(i), 0.01)
    completer.failed(job(3), Outcome("queued", 1.0, "boom"), 0.01)
    completer.failed(job(4), Outcome("failed", 0.0, "boom"), 0.01)
    run_async(completer.flush())
    assert store.history == [([1, 3], ["w1"] * 2, ["completed", "retried"])]
    assert (
        completer.stats.completed,
        completer.stats.retried,
        completer.stats.failed,
        completer.stats.fenced,
    ) == (1, 1, 0, 2)


def test_a_snooze_is_recorded_as_snoozed_within_the_cap_and_as_its_failure_past_it():
    store = FakeStore()
    store.over = {2}
    completer = make(store, history=True)
    fallback = Outcome(
        "queued", 3.0, "snoozed 100 times (DISPATCHER_MAX_SNOOZES), and again: snoozed for 5 s"
    )
    for i in (1, 2):
        completer.failed(
            job(i, attempts=4), fallback, 0.01, summary="snoozed for 5 s", snooze=(5.0, 100)
        )
    run_async(completer.flush())
    assert store.history == [([1, 2], ["w1"] * 2, ["snoozed", "retried"])]
    assert (completer.stats.snoozed, completer.stats.retried) == (1, 1)
