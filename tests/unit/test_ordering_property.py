"""The claim's choice under ordering keys, property-tested on dispatcher.testing.MemoryStore: random
sequences of enqueues (a few keys, some jobs without one), claims, completions, failures (retried,
final and halting, final and continuing), releases, cancels and an operator's retry or cancel of a
halted job, with ordering keys' rules checked after every step (tests/ordering_steps.py says
which). tests/contract/test_ordering_replay.py replays such sequences on PostgreSQL too."""

from __future__ import annotations

from hypothesis import given, settings

from dispatcher import JobSpec, enqueue, enqueue_many
from dispatcher.db.port import JobStorePort
from dispatcher.testing import MemoryStore
from tests.helpers import run_async
from tests.ordering_steps import Row, Step, holder_problems, replay, steps

QUEUE = "ordered"


class MemoryTarget:
    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.store: JobStorePort = self.memory
        self.queue = QUEUE

    async def enqueue(self, keys: list[str | None], priority: int) -> None:
        if len(keys) == 1:
            await enqueue(
                self.memory, "t", {}, queue=QUEUE, ordering_key=keys[0], priority=priority
            )
        else:
            await enqueue_many(
                self.memory, [JobSpec("t", {}, queue=QUEUE, ordering_key=k) for k in keys]
            )

    async def rows(self) -> list[Row]:
        return [
            Row(j.id, j.ordering_key, j.status, j.ordering_halted, j.priority, j.run_at)
            for j in sorted(self.memory.jobs(queue=QUEUE), key=lambda j: j.id)
        ]

    async def retry(self, job_id: int) -> None:
        assert self.memory.retry([job_id]) == [job_id]

    async def tick(self) -> None:
        self.memory.clock.advance(0.001)  # run_at orders steps as PostgreSQL's now() does


@settings(max_examples=300, deadline=None)
@given(steps())
def test_ordering_rules_hold_after_every_step_on_the_memory_store(sequence: list[Step]) -> None:
    run_async(replay(MemoryTarget(), sequence))


def test_a_halted_key_claims_nothing_until_its_failed_job_is_retried_then_runs_in_order() -> None:
    async def scenario() -> None:
        target = MemoryTarget()
        store = target.memory
        await target.enqueue(["k0", "k0", "k0", "k1"], 0)
        # k0's first job fails for good and halts k0; k1 runs on.
        await replay(target, [("claim", 4, False), ("fail", 0, "failed")])
        rows = await target.rows()
        k0 = [r for r in rows if r.key == "k0"]
        assert [(r.status, r.halted) for r in k0] == [
            ("failed", True),
            ("waiting", False),
            ("waiting", False),
        ]
        assert [r.status for r in rows if r.key == "k1"] == ["completed"]
        assert store.claim(QUEUE, 10, 30).jobs == []
        await target.retry(k0[0].id)
        assert not holder_problems(await target.rows())
        order = []
        while jobs := store.claim(QUEUE, 10, 30).jobs:
            order += [j.id for j in jobs]
            store.complete([j.id for j in jobs], [j.token for j in jobs])
        assert order == [r.id for r in k0]

    run_async(scenario())
