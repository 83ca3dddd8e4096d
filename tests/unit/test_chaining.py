"""Chained claims with fakes: the slots a keyed completion reserves, the buckets it offers, and
what it starts; the completer's use of them, a failed statement included."""

from __future__ import annotations

import pytest

from coordinator.assignment import StaticAssignment
from dispatcher.db.rows import Chain, Completion
from dispatcher.errors import StoreUnavailable
from dispatcher.model import Job
from dispatcher.runtime.chaining import Chaining
from dispatcher.runtime.completer import Completer
from dispatcher.settings.sections import CompletionSettings
from tests.helpers import run_async


class FakeExecutor:
    def __init__(self, in_flight: int = 0) -> None:
        self.in_flight = in_flight
        self.started: list[tuple[list[int], float]] = []
        self.freed = 0

        class Freed:
            def set(inner) -> None:
                self.freed += 1

        self.slot_freed = Freed()

    def start(self, jobs: list[Job], claimed_at: float) -> None:
        self.in_flight += len(jobs)
        self.started.append(([j.id for j in jobs], claimed_at))


class Degraded:
    def owned(self):
        return None


def job(job_id: int, key: str | None = "k") -> Job:
    return Job(
        id=job_id,
        job_type="t",
        payload={},
        attempts=1,
        max_attempts=5,
        locked_at=None,
        bucket=3,
        priority=0,
        ordering_key=key,
        token=f"00000000-0000-0000-0000-{job_id:012d}",
    )


def chaining(executor: FakeExecutor, claiming: bool = True, **assignments) -> Chaining:
    return Chaining(
        lambda: executor,
        assignments or {"default": StaticAssignment((3, 7)), "mail": Degraded()},  # type: ignore[arg-type]
        concurrency=10,
        lease_s=30.0,
        mode="partitioned",
        claiming=lambda: claiming,
    )


def test_a_chain_offers_the_owned_buckets_of_each_queue_and_holds_the_free_slots_until_settled():
    executor = FakeExecutor(in_flight=4)
    plan = chaining(executor)
    chain = plan.reserve()
    assert chain == Chain(("default", "default"), (3, 7), 6, 30.0), (
        "a degraded queue offers nothing"
    )
    assert executor.in_flight == 10, "the producer sees no free slot while the statement runs"
    plan.settle(chain, [job(1), job(2)], sent_at=12.5)
    assert executor.in_flight == 6 and executor.started == [([1, 2], 12.5)] and executor.freed == 1
    assert plan.chained == 2


@pytest.mark.parametrize("in_flight, claiming", [(10, True), (12, True), (0, False)])
def test_no_free_slot_or_a_shutdown_chains_nothing(in_flight, claiming):
    executor = FakeExecutor(in_flight)
    chain = chaining(executor, claiming).reserve()
    assert chain.limit == 0 and executor.in_flight == in_flight


class FakeStore:
    worker_id = "w1"

    def __init__(self) -> None:
        self.chains: list[Chain] = []
        self.down = False

    async def jobs_complete(self, ids, tokens, *, keyed=False, chain=None, buckets=None):
        assert keyed and chain is not None, "a keyed batch in partitioned mode offers a chain"
        self.chains.append(chain)
        if self.down:
            raise StoreUnavailable("complete: database unavailable")
        return Completion(len(ids), [], [job(100 + i) for i in range(min(chain.limit, len(ids)))])


def test_the_completer_chains_keyed_batches_and_gives_the_slots_back_when_the_statement_fails():
    store, executor = FakeStore(), FakeExecutor(in_flight=2)
    completer = Completer(
        store,  # type: ignore[arg-type]
        CompletionSettings(flush_interval_s=10.0, flush_max=100, history=False),
        chaining=chaining(executor),
    )
    completer.completed(job(1), 0.0)
    completer.completed(job(2), 0.0)
    executor.in_flight = 0  # their slots were freed when their handlers returned
    run_async(completer.flush())
    assert store.chains[0].limit == 10 and [ids for ids, _ in executor.started] == [[100, 101]]
    assert executor.in_flight == 2 and completer.stats.completed == 2

    completer.completed(job(3), 0.0)
    store.down = True
    with pytest.raises(StoreUnavailable):
        run_async(completer.flush())
    assert executor.in_flight == 2, "the reserved slots came back"
    assert completer.pending == 1, "the completion waits for the next flush"
