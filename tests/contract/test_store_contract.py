"""The store contract: the same assertions against the real PostgreSQL store (JobStore) and the
in-memory one of dispatcher.testing, through the port (dispatcher/db/port.py). What a user's unit
test sees of MemoryStore must be what a worker gets of PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from dispatcher.constants import COMPLETED_DELETE, COMPLETED_JOBS, COMPLETED_KEEP
from dispatcher.db.rows import Failure, Steal
from dispatcher.model import (
    STATUS_CANCELLED,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    FailureKind,
    Job,
    Outcome,
)
from dispatcher.runtime.maintenance import Reaper
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.sections import MaintenanceSettings
from tests.contract.store_support import KINDS, Harness, open_harness
from tests.helpers import run_async

OTHER_TOKEN = "00000000-0000-0000-0000-00000000beef"
Run = Callable[[Callable[[Harness], Awaitable[Any]]], Any]


@pytest.fixture(params=KINDS)
def on_store(request: pytest.FixtureRequest) -> Run:
    """Runs `test(harness)` on a fresh store of this kind, in an event loop of its own."""
    return _runner(request, COMPLETED_KEEP)


@pytest.fixture(
    params=[(kind, completed_jobs) for kind in KINDS for completed_jobs in COMPLETED_JOBS],
    ids=lambda p: "-".join(p),
)
def on_store_completing(request: pytest.FixtureRequest) -> Run:
    """As on_store, under each DISPATCHER_COMPLETED_JOBS: the harness's `completed_jobs` says
    which."""
    return _runner(request, request.param[1], kind=request.param[0])


def _runner(request: pytest.FixtureRequest, completed_jobs: str, kind: str | None = None) -> Run:
    kind = kind or request.param
    dsn = request.getfixturevalue("dsn") if kind == "postgres" else None

    def run(test: Callable[[Harness], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            harness = await open_harness(kind, dsn, completed_jobs)
            try:
                return await test(harness)
            finally:
                await harness.close()

        return run_async(main())

    return run


def not_ours(job_id: int) -> Job:
    """The job as a claimer that does not own it holds it: under another token."""
    return Job(
        id=job_id,
        job_type="send",
        payload={},
        attempts=1,
        max_attempts=20,
        locked_at=None,
        bucket=0,
        priority=0,
        ordering_key=None,
        token=OTHER_TOKEN,
    )


async def claim_one(h: Harness, lease_s: float = 30.0) -> Job:
    jobs = (await h.store.jobs_claim("default", 1, lease_s, None)).jobs
    assert len(jobs) == 1, f"expected one due job, claimed {jobs}"
    return jobs[0]


def retry(delay_s: float, error: str = "boom") -> Outcome:
    return Outcome(STATUS_QUEUED, delay_s, error)


def test_an_enqueued_job_is_claimed_once_running_under_a_token_with_its_attempt_counted(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue(
            "send", {"to": "a@example.com", "n": [1, 2]}, priority=3, max_attempts=4
        )
        queued = await h.store.job_get(job_id)
        assert queued is not None and (queued.status, queued.attempts, queued.job_type) == (
            STATUS_QUEUED,
            0,
            "send",
        )
        job = await claim_one(h)
        assert (
            job.id,
            job.job_type,
            job.payload,
            job.attempts,
            job.max_attempts,
            job.priority,
        ) == (job_id, "send", {"to": "a@example.com", "n": [1, 2]}, 1, 4, 3)
        assert job.token and job.queue == "default"
        running = await h.store.job_get(job_id)
        assert running is not None and (running.status, running.locked_by) == (STATUS_RUNNING, "w1")
        assert running.lease_expires_at is not None and running.lease_expires_at > await h.now()
        assert (
            job.locked_at is not None
            and running.locked_at is not None
            and job.locked_at.tzinfo is not None
        )
        assert abs((job.locked_at - running.locked_at).total_seconds()) < 1e-5, (
            "the claim's time, as stored"
        )
        assert (await h.store.jobs_claim("default", 10, 30.0, None)).jobs == [], (
            "a running job is not claimed again"
        )
        assert await h.store.job_get(job_id + 1000) is None

    on_store(test)


def test_a_write_by_a_token_that_does_not_own_the_job_changes_nothing(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        job = await claim_one(h)
        assert (await h.store.jobs_complete([job_id], [OTHER_TOKEN])).completed == 0
        assert await h.store.jobs_fail_owned([Failure(job_id, OTHER_TOKEN, retry(1.0))]) == []
        assert await h.store.jobs_extend_leases([not_ours(job_id)], 30.0) == {}
        assert await h.store.jobs_release_owned([not_ours(job_id)]) == 0
        state = await h.store.job_get(job_id)
        assert state is not None and (state.status, state.attempts, state.last_error) == (
            STATUS_RUNNING,
            1,
            None,
        )
        assert (await h.store.jobs_complete([job_id], [job.token])).completed == 1
        assert (await h.store.jobs_complete([job_id], [job.token])).completed == 0, (
            "finished: nobody owns it any more"
        )
        state = await h.store.job_get(job_id)
        assert (
            state is not None
            and state.status == STATUS_COMPLETED
            and state.completed_at is not None
        )

    on_store(test)


def test_a_completion_keeps_the_row_completed_or_deletes_it_as_set_and_is_fenced_either_way(
    on_store_completing: Run,
) -> None:
    """DISPATCHER_COMPLETED_JOBS: keep marks the job completed, delete removes it; a taken-over
    job's old owner changes nothing under either; only a success deletes (a retry keeps its row)."""

    async def test(h: Harness) -> None:
        deletes = h.completed_jobs == COMPLETED_DELETE
        job_id = await h.enqueue("send", max_attempts=5)
        old = await claim_one(h, lease_s=5.0)
        await h.expire_lease(job_id)
        assert [e.id for e in await h.store.jobs_lease_expired()] == [job_id]
        assert await h.store.jobs_fail_owned(
            [Failure(job_id, old.token, retry(0.0))], lease_expired=True
        )
        await h.make_due(job_id)
        new = (await (await h.claimer("w2")).jobs_claim("default", 1, 30.0, None)).jobs
        assert [j.id for j in new] == [job_id]
        assert (await h.store.jobs_complete([job_id], [old.token])).completed == 0, (
            "the old owner: fenced"
        )
        state = await h.store.job_get(job_id)
        assert state is not None and state.status == STATUS_RUNNING
        assert (await h.store.jobs_complete([job_id], [new[0].token])).completed == 1
        state = await h.store.job_get(job_id)
        if deletes:
            assert state is None, "deleted by its completion"
        else:
            assert (
                state is not None
                and state.status == STATUS_COMPLETED
                and state.completed_at is not None
            )
        assert (await h.store.jobs_complete([job_id], [new[0].token])).completed == 0, (
            "finished: nobody owns it any more"
        )
        retried_id = await h.enqueue("send")
        other = await claim_one(h)
        assert other.id == retried_id
        assert [
            w.status
            for w in await h.store.jobs_fail_owned([Failure(retried_id, other.token, retry(60.0))])
        ] == [STATUS_QUEUED]
        kept = await h.store.job_get(retried_id)
        assert kept is not None and kept.status == STATUS_QUEUED, "a retry keeps its row"

    on_store_completing(test)


def test_after_a_lease_expires_and_another_worker_claims_the_job_the_old_owner_is_fenced(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send", max_attempts=5)
        old = await claim_one(h, lease_s=5.0)
        await h.expire_lease(job_id)
        expired = await h.store.jobs_lease_expired()
        assert [(e.id, e.token, e.attempts, e.lease_expiries) for e in expired] == [
            (job_id, old.token, 1, 1)
        ]
        outcome = RetryPolicy(1.0, 60.0, rand=lambda: 0.5).decide(
            FailureKind.LEASE_EXPIRED, 1, 5, "lease expired"
        )
        written = await h.store.jobs_fail_owned(
            [Failure(job_id, old.token, outcome)], lease_expired=True
        )
        assert [(w.id, w.status) for w in written] == [(job_id, STATUS_QUEUED)]
        await h.make_due(job_id)
        new = (await (await h.claimer("w2")).jobs_claim("default", 1, 30.0, None)).jobs
        assert (
            [j.id for j in new] == [job_id] and new[0].token != old.token and new[0].attempts == 2
        )
        assert (await h.store.jobs_complete([job_id], [old.token])).completed == 0, (
            "the old owner came back: fenced"
        )
        assert await h.store.jobs_extend_leases([old], 30.0) == {}
        state = await h.store.job_get(job_id)
        assert state is not None and (state.status, state.lease_expiries) == (STATUS_RUNNING, 1)
        assert (await h.store.jobs_complete([job_id], [new[0].token])).completed == 1

    on_store(test)


def test_a_live_lease_is_not_expired_and_an_extension_is_returned_with_its_cancel_flag(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        job = await claim_one(h)
        assert await h.store.jobs_lease_expired() == []
        assert await h.store.jobs_extend_leases([job], 60.0) == {job_id: False}
        assert (
            await h.store.jobs_fail_owned(
                [Failure(job_id, job.token, retry(1.0))], lease_expired=True
            )
            == []
        ), "the reaper's write needs the lease to be expired still"

    on_store(test)


def test_a_retry_is_due_in_the_future_and_claimable_once_it_is_due(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send", max_attempts=3)
        job = await claim_one(h)
        before = await h.now()
        outcome = RetryPolicy(10.0, 60.0, rand=lambda: 0.5).decide(
            FailureKind.ERROR, 1, 3, "Traceback: boom"
        )
        written = await h.store.jobs_fail_owned([Failure(job_id, job.token, outcome)])
        assert len(written) == 1 and written[0].status == STATUS_QUEUED
        assert written[0].run_at is not None and written[0].run_at >= before + timedelta(
            seconds=5.0
        )
        state = await h.store.job_get(job_id)
        assert state is not None and (state.status, state.last_error, state.run_at) == (
            STATUS_QUEUED,
            "Traceback: boom",
            written[0].run_at,
        )
        assert (await h.store.jobs_claim("default", 10, 30.0, None)).jobs == [], "not due yet"
        await h.make_due(job_id)
        again = await claim_one(h)
        assert (again.id, again.attempts) == (job_id, 2)

    on_store(test)


def test_the_attempt_that_reaches_max_attempts_fails_the_job_for_good(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        policy = RetryPolicy(1.0, 60.0, rand=lambda: 0.0)
        job_id = await h.enqueue("send", max_attempts=2)
        statuses = []
        for _ in range(2):
            job = await claim_one(h)
            outcome = policy.decide(
                FailureKind.ERROR, job.attempts, job.max_attempts, f"attempt {job.attempts}"
            )
            statuses += [
                w.status
                for w in await h.store.jobs_fail_owned([Failure(job.id, job.token, outcome)])
            ]
            if statuses[-1] == STATUS_QUEUED:
                await h.make_due(job_id)
        assert statuses == [STATUS_QUEUED, STATUS_FAILED]
        state = await h.store.job_get(job_id)
        assert state is not None
        assert (state.status, state.attempts, state.last_error) == (STATUS_FAILED, 2, "attempt 2")
        assert state.failed_at is not None
        await h.make_due(job_id)
        assert (await h.store.jobs_claim("default", 10, 30.0, None)).jobs == []

    on_store(test)


def test_cancel_ends_a_queued_job_and_asks_a_running_one_which_then_is_never_retried(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        running_id = await h.enqueue("send", priority=-1)
        job = await claim_one(h)
        queued_id = await h.enqueue("send")
        finished_id = await h.enqueue("send", priority=-2)
        finished = await claim_one(h)
        assert (await h.store.jobs_complete([finished_id], [finished.token])).completed == 1
        assert await h.store.jobs_cancel([queued_id, running_id, finished_id, 999_999]) == {
            queued_id: STATUS_CANCELLED,
            running_id: STATUS_RUNNING,
        }
        assert (await h.store.jobs_claim("default", 10, 30.0, None)).jobs == [], (
            "a cancelled job never runs"
        )
        assert await h.store.jobs_extend_leases([job], 30.0) == {running_id: True}, (
            "the owner sees the request"
        )
        written = await h.store.jobs_fail_owned([Failure(running_id, job.token, retry(0.001))])
        assert [w.status for w in written] == [STATUS_CANCELLED], (
            "a retry of a job asked to cancel ends cancelled"
        )
        states = [await h.store.job_get(i) for i in (queued_id, running_id, finished_id)]
        assert [s.status for s in states if s] == [
            STATUS_CANCELLED,
            STATUS_CANCELLED,
            STATUS_COMPLETED,
        ]
        assert all(s.cancel_requested_at is not None for s in states[:2] if s)

    on_store(test)


def test_concurrent_claims_never_hand_one_job_to_two_claimers(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        ids = {await h.enqueue("send", {"i": i}) for i in range(60)}
        claimers = [await h.claimer(f"w{n}") for n in range(2, 7)]

        async def claim_all(store: Any) -> list[tuple[int, str]]:
            got: list[tuple[int, str]] = []
            while batch := (await store.jobs_claim("default", 7, 30.0, None)).jobs:
                got += [(j.id, j.token) for j in batch]
                await asyncio.sleep(0)
            return got

        claimed = [pair for got in await asyncio.gather(*map(claim_all, claimers)) for pair in got]
        assert sorted(i for i, _ in claimed) == sorted(ids), "every job claimed exactly once"
        tokens = dict(claimed)
        assert (await h.store.jobs_complete(list(tokens), list(tokens.values()))).completed == 60

    on_store(test)


def test_claims_come_in_priority_then_run_at_then_id_order(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        now = await h.now()
        earlier, earliest = now - timedelta(seconds=10), now - timedelta(seconds=20)
        a = await h.enqueue("send", {"n": "a"}, priority=5)
        b = await h.enqueue("send", {"n": "b"}, priority=0, run_at=earlier)
        c = await h.enqueue("send", {"n": "c"}, priority=0, run_at=earliest)
        d = await h.enqueue("send", {"n": "d"}, priority=-3)
        e = await h.enqueue("send", {"n": "e"}, priority=0, run_at=earlier)
        await h.enqueue("send", {"n": "later"}, priority=-9, delay_s=3600)
        first_two = {j.id for j in (await h.store.jobs_claim("default", 2, 30.0, None)).jobs}
        assert first_two == {d, c}, (
            "a batch is the head of the order (returned in no particular order)"
        )
        order = [
            j.id
            for _ in range(3)
            for j in (await h.store.jobs_claim("default", 1, 30.0, None)).jobs
        ]
        assert order == [b, e, a]
        assert (await h.store.jobs_claim("default", 10, 30.0, None)).jobs == [], (
            "a job due later is not claimed, whatever its priority"
        )

    on_store(test)


def test_claims_read_one_queue_and_the_buckets_asked_for(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        in_3 = await h.enqueue("send", bucket=3)
        await h.enqueue("send", bucket=4)
        other_queue = await h.enqueue("send", queue="mail", bucket=3)
        assert [j.id for j in (await h.store.jobs_claim("default", 10, 30.0, [3, 5])).jobs] == [
            in_3
        ]
        assert [
            (j.id, j.queue) for j in (await h.store.jobs_claim("mail", 10, 30.0, None)).jobs
        ] == [(other_queue, "mail")]
        with pytest.raises(ValueError):
            await h.store.jobs_claim("default", 10, 30.0, [])

    on_store(test)


def test_a_claim_window_takes_nothing_while_another_bucket_of_the_claimer_has_a_better_job(
    on_store: Run,
) -> None:
    """A claim window (`outside`: the claimer's other buckets) is vetoed by a due job there of
    strictly better priority than the worst it would take; not by a tie, a job not due yet, or
    a job of a bucket not named."""

    async def test(h: Harness) -> None:
        best, worst = [await h.enqueue("send", bucket=3, priority=p) for p in (1, 4)]
        other = await h.enqueue("send", bucket=5, priority=2)
        await h.enqueue("send", bucket=5, priority=0, delay_s=3600)  # not due
        await h.enqueue("send", bucket=7, priority=0)  # not the claimer's

        vetoed = await h.store.jobs_claim("default", 2, 30.0, [3], outside=[5])
        assert (vetoed.jobs, vetoed.outranked) == ([], True), "4 would pass bucket 5's 2"
        first = await h.store.jobs_claim("default", 1, 30.0, [3], outside=[5])
        assert ([j.id for j in first.jobs], first.outranked) == ([best], False)
        tie = await h.enqueue("send", bucket=3, priority=2)
        second = await h.store.jobs_claim("default", 1, 30.0, [3], outside=[5])
        assert [j.id for j in second.jobs] == [tie], "a tie is no veto"
        assert (await h.store.jobs_claim("default", 1, 30.0, [3], outside=[5])).outranked
        empty = await h.store.jobs_claim("default", 5, 30.0, [8], outside=[3, 5])
        assert (empty.jobs, empty.selected, empty.outranked) == ([], 0, False)
        rest = (await h.store.jobs_claim("default", 5, 30.0, [3, 5])).jobs
        assert sorted(j.id for j in rest) == sorted([other, worst]), "the vetoes took nothing"

    on_store(test)


def test_a_steal_takes_from_the_tail_of_each_bucket_beyond_its_reserve_in_the_order_given(
    on_store: Run,
) -> None:
    async def test(h: Harness) -> None:
        in_5 = [await h.enqueue("send", bucket=5) for _ in range(10)]
        in_6 = [await h.enqueue("send", bucket=6) for _ in range(3)]
        urgent_in_5 = await h.enqueue("send", bucket=5, priority=-5)
        stolen = (
            await h.store.jobs_claim("default", 100, 30.0, None, Steal((6, 5), reserve=4))
        ).jobs
        # Bucket 6 is no deeper than the reserve: its owner keeps all 3. Bucket 5 keeps the head of
        # its claim order (the urgent job, then the 3 oldest) and gives the 7 behind them.
        assert sorted(j.id for j in stolen) == in_5[3:]
        assert {j.bucket for j in stolen} == {5}
        head = (await h.store.jobs_claim("default", 100, 30.0, [5, 6])).jobs
        assert sorted(j.id for j in head) == sorted([urgent_in_5, *in_5[:3], *in_6])
        # Limited: the deepest part of the tail first, and nothing from a bucket not listed.
        more = [await h.enqueue("send", bucket=7) for _ in range(6)]
        await h.enqueue("send", bucket=8)
        stolen = (await h.store.jobs_claim("default", 2, 30.0, None, Steal((7,)))).jobs
        assert sorted(j.id for j in stolen) == more[-2:]

    on_store(test)


def test_a_dedupe_key_is_held_by_a_live_job_only(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        first = await h.enqueue("send", dedupe_key="k1")
        assert first is not None
        assert await h.enqueue("send", dedupe_key="k1") is None, "a live job holds the key"
        assert await h.enqueue("send", dedupe_key="k1", queue="mail") is not None, (
            "keys are per queue"
        )
        job = await claim_one(h)
        assert await h.enqueue("send", dedupe_key="k1") is None, "a running job still holds it"
        assert (await h.store.jobs_complete([first], [job.token])).completed == 1
        assert await h.enqueue("send", dedupe_key="k1") is not None, "a finished job no longer does"

    on_store(test)


def test_a_released_job_is_queued_again_without_its_unstarted_attempt(on_store: Run) -> None:
    async def test(h: Harness) -> None:
        job_id = await h.enqueue("send")
        job = await claim_one(h)
        assert await h.store.jobs_release_owned([job]) == 1
        state = await h.store.job_get(job_id)
        assert state is not None and (state.status, state.attempts) == (STATUS_QUEUED, 0)
        assert (await claim_one(h)).attempts == 1

    on_store(test)


def test_the_reaper_retries_a_job_whose_lease_ran_out_and_fails_it_at_max_attempts(
    on_store: Run,
) -> None:
    """The worker's own Reaper, on either store: expiry goes through the retry policy."""

    async def test(h: Harness) -> None:
        reaped: list[int] = []
        settings = MaintenanceSettings(
            reaper_interval_s=1.0, history=False, table_sample_interval_s=15.0
        )
        reaper = Reaper(
            h.store,
            RetryPolicy(1.0, 60.0, rand=lambda: 0.5),
            settings,  # type: ignore[arg-type]
            on_reaped=lambda: reaped.append(1),
        )
        job_id = await h.enqueue("send", max_attempts=2)
        for attempt, status in ((1, STATUS_QUEUED), (2, STATUS_FAILED)):
            job = await claim_one(h, lease_s=5.0)
            await reaper.tick()
            assert reaped == [1] * (attempt - 1), "a live lease is not reaped"
            await h.expire_lease(job_id)
            await reaper.tick()
            state = await h.store.job_get(job_id)
            assert state is not None and (state.status, state.attempts, state.lease_expiries) == (
                status,
                attempt,
                attempt,
            )
            assert (state.last_error or "").startswith(
                f"lease expired {'once' if attempt == 1 else '2 times'}"
            )
            assert (await h.store.jobs_complete([job_id], [job.token])).completed == 0, (
                "the stalled owner is fenced"
            )
            if status == STATUS_QUEUED:
                assert state.run_at > await h.now()
                await h.make_due(job_id)
        assert reaper.reaped == 2

    on_store(test)
