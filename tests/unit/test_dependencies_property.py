"""Dependencies property-tested on dispatcher.testing.MemoryStore: random graphs (each job after
some earlier ones, each with its on_parent_failure), then claims that complete or fail what they
took and an operator's cancels and retries; after every step a job is runnable exactly when its
parents allow it (tests/dependency_steps.py says how that is checked).
tests/contract/test_dependencies_replay.py replays such sequences on PostgreSQL too."""

from __future__ import annotations

from hypothesis import given, settings

from dispatcher import Workflow, enqueue_workflow
from dispatcher.db.port import JobStorePort
from dispatcher.testing import MemoryStore
from tests.dependency_steps import Node, Step, graphs, replay, step_lists
from tests.helpers import run_async


class MemoryTarget:
    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.store: JobStorePort = self.memory
        self.queue = "graphs"

    async def insert(self, workflow: Workflow) -> list[int]:
        return list((await enqueue_workflow(self.memory, workflow)).values())

    async def statuses(self, ids: list[int]) -> list[str]:
        states = [self.memory.get(i) for i in ids]
        return [s.status if s is not None else "gone" for s in states]

    async def retry(self, job_id: int) -> bool:
        return self.memory.retry([job_id]) == [job_id]

    async def tick(self) -> None:
        self.memory.clock.advance(0.001)


@settings(max_examples=400, deadline=None)
@given(graphs(), step_lists())
def test_a_job_is_runnable_exactly_when_its_parents_allow_it(
    graph: list[Node], steps: list[Step]
) -> None:
    run_async(replay(MemoryTarget(), graph, steps))
