"""Random dependency graphs and what happens to them, for the property tests of dependencies
(tests/unit/test_dependencies_property.py on MemoryStore, tests/contract/test_dependencies_replay.py
on PostgreSQL): a graph of a few jobs (each after some earlier ones, each with its policy for a
parent that fails), then steps: claims that complete or fail for good what they took, an
operator's cancel or retry. After every step the rule is checked (`problems`):
- a job left `blocked` while all its parents allow it (stranded), or while a parent that ended
  badly dooms it (policy 'cancel'), is a problem;
- a job that left `blocked` at this step must have had every parent allow it then, or have been
  cancelled by a parent that ended badly (policy 'cancel') or by the operator;
- a job that runs (claimed) must never have been `blocked` with a parent not allowing it.
`replay` answers each step's statuses, so two stores can be compared step by step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hypothesis import strategies as st

from dispatcher import Workflow
from dispatcher.db.port import JobStorePort
from dispatcher.db.rows import Failure
from dispatcher.model import (
    STATUS_BLOCKED,
    STATUS_CANCELLED,
    STATUS_COMPLETED,
    STATUS_DISCARDED,
    STATUS_FAILED,
    Outcome,
)

POLICIES = ("cancel", "run", "wait")
_BAD = (STATUS_FAILED, STATUS_DISCARDED, STATUS_CANCELLED)


@dataclass(frozen=True)
class Node:
    parents: tuple[int, ...]
    policy: str


@dataclass(frozen=True)
class Step:
    action: str  # complete | fail | cancel | retry
    n: int  # how many to claim, or which job (position in the graph)


class Target(Protocol):
    store: JobStorePort
    queue: str

    async def insert(self, workflow: Workflow) -> list[int]: ...

    async def statuses(self, ids: list[int]) -> list[str]: ...

    async def retry(self, job_id: int) -> bool: ...

    async def tick(self) -> None:
        """Time moves on between steps: a job queued by a release is due from its release, after
        the jobs queued before it (run_at orders claims as PostgreSQL's now() does)."""


@st.composite
def graphs(draw: Any, max_jobs: int = 7) -> list[Node]:
    n = draw(st.integers(2, max_jobs))
    nodes = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        nodes.append(Node(tuple(sorted(parents)), draw(st.sampled_from(POLICIES))))
    return nodes


def step_lists(max_size: int = 14) -> Any:
    return st.lists(
        st.one_of(
            st.builds(Step, st.just("complete"), st.integers(1, 3)),
            st.builds(Step, st.just("fail"), st.integers(1, 2)),
            st.builds(Step, st.just("cancel"), st.integers(0, 6)),
            st.builds(Step, st.just("retry"), st.integers(0, 6)),
        ),
        max_size=max_size,
    )


def workflow(graph: list[Node], queue: str) -> Workflow:
    wf = Workflow()
    for i, node in enumerate(graph):
        wf.add(
            f"j{i}",
            "t",
            {"i": i},
            queue=queue,
            after=[f"j{p}" for p in node.parents],
            on_parent_failure=node.policy,  # type: ignore[arg-type]
        )
    return wf


@dataclass
class History:
    """What each job has been so far: an edge is released once, when its parent first ends (a
    parent retried after that does not take it back)."""

    completed: set[int]
    ended_badly: set[int]

    def saw(self, statuses: list[str]) -> None:
        for i, status in enumerate(statuses):
            if status == STATUS_COMPLETED:
                self.completed.add(i)
            elif status in _BAD:
                self.ended_badly.add(i)

    def allows(self, policy: str, parent: int) -> bool:
        """The parent's edge is released as satisfied: it completed, or ended badly and the
        child runs anyway."""
        return parent in self.completed or (parent in self.ended_badly and policy == "run")

    def dooms(self, policy: str, parent: int) -> bool:
        return policy == "cancel" and parent in self.ended_badly


def problems(
    graph: list[Node],
    before: list[str],
    after: list[str],
    history: History,
    cancelled: int | None = None,
) -> list[str]:
    """What breaks the rule, given every job's status before and after a step, and what each was
    up to it (`history`, this step included; `cancelled`: the job an operator cancelled in it)."""
    found = []
    for i, node in enumerate(graph):
        parents_after = [after[p] for p in node.parents]
        parents_before = [before[p] for p in node.parents]
        doomed = any(history.dooms(node.policy, p) for p in node.parents)
        ready = all(history.allows(node.policy, p) for p in node.parents)
        if after[i] == STATUS_BLOCKED and node.parents and (ready or doomed):
            found.append(f"j{i} stranded blocked: parents {parents_after}, policy {node.policy}")
        if before[i] == STATUS_BLOCKED and after[i] != STATUS_BLOCKED:
            if after[i] == STATUS_CANCELLED:
                if not (doomed or i == cancelled):
                    found.append(f"j{i} cancelled, but no parent doomed it: {parents_after}")
                continue
            if not ready or doomed:
                found.append(
                    f"j{i} left blocked for {after[i]} with parents {parents_before} -> "
                    f"{parents_after}, policy {node.policy}"
                )
    return found


async def replay(target: Target, graph: list[Node], steps: list[Step]) -> list[list[str]]:
    """The graph inserted, then each step; every job's status after each (and the rule checked)."""
    ids = await target.insert(workflow(graph, target.queue))
    position = {job_id: i for i, job_id in enumerate(ids)}
    seen = [await target.statuses(ids)]
    initial = [STATUS_BLOCKED if node.parents else "queued" for node in graph]
    history = History(set(), set())
    history.saw(seen[0])
    found = problems(graph, initial, seen[0], history)
    assert not found, found
    for step in steps:
        await target.tick()
        before = seen[-1]
        if step.action in ("complete", "fail"):
            claimed = (await target.store.jobs_claim(target.queue, step.n, 30.0, None)).jobs
            for job in claimed:
                i = position[job.id]
                assert before[i] == "queued", f"j{i} claimed while {before[i]}"
            if step.action == "complete":
                await target.store.jobs_complete(
                    [j.id for j in claimed], [j.token for j in claimed]
                )
            else:
                await target.store.jobs_fail_owned(
                    [Failure(j.id, j.token, Outcome(STATUS_DISCARDED, 0.0, "bad")) for j in claimed]
                )
        elif step.action == "cancel" and step.n < len(ids):
            await target.store.jobs_cancel([ids[step.n]])
        elif (
            step.action == "retry"
            and step.n < len(ids)
            and before[step.n]
            in (
                STATUS_FAILED,
                STATUS_DISCARDED,
            )
        ):
            await target.retry(ids[step.n])
        after = await target.statuses(ids)
        history.saw(after)
        found = problems(graph, before, after, history, step.n if step.action == "cancel" else None)
        assert not found, f"after {step}: {found}"
        seen.append(after)
    return seen
