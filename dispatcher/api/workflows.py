"""Workflows and batches: many jobs enqueued at once, some running only after others.

A `Workflow` is a graph of named steps, each a job that runs once every step (or existing job) it
comes `after` completed; a step added must name only steps added before it, so no cycle can be
built. A batch is a group of jobs and a callback job that runs once, when the last of them has
finished, whatever its outcome, with the batch's counts by outcome in its payload. Both go in
whole, in one transaction, and the database keeps their order (dispatcher/db/dependencies.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Unpack

from dispatcher.api.enqueue import AsyncTarget, SyncTarget
from dispatcher.api.enqueue_checks import ParentFailure, check_depends_on
from dispatcher.api.enqueue_graph import graph_async, graph_sync
from dispatcher.api.enqueue_prepare import JobOptions, JobSpec, _prepare_all
from dispatcher.api.results import JobHandle
from dispatcher.db.dependencies import GraphJob
from dispatcher.errors import EnqueueError
from dispatcher.settings.defaults import DEFAULT_MAX_PAYLOAD_BYTES


@dataclass(frozen=True, slots=True)
class _Step:
    name: str
    spec: JobSpec
    after: tuple[str, ...]
    external: tuple[int, ...]
    on_parent_failure: ParentFailure


class Workflow:
    """Named steps, each a job that runs after the steps (names) and jobs (ids) it comes `after`.

        wf = Workflow()
        wf.add("fetch", "fetch_page", {"url": url})
        for n in range(3):
            wf.add(f"thumb-{n}", "thumbnail", {"n": n}, after=["fetch"])
        wf.add("index", "build_index", after=[f"thumb-{n}" for n in range(3)])
        ids = await enqueue_workflow(pool, wf)  # {"fetch": 17, "thumb-0": 18, ...}

    A step's job is a job type with its payload and enqueue's options, or a JobSpec (a typed
    task's `spec(...)`). `on_parent_failure`: what the step does if a parent ends failed,
    discarded or cancelled: "cancel" (the default; its own dependents follow their policy),
    "run" (it runs anyway), "wait" (it waits for an operator: retry the parent, or cancel it)."""

    def __init__(self) -> None:
        self._steps: dict[str, _Step] = {}

    def add(
        self,
        name: str,
        job: str | JobSpec,
        payload: Any = None,
        *,
        after: Iterable[str | int] = (),
        on_parent_failure: ParentFailure = "cancel",
        **options: Unpack[JobOptions],
    ) -> str:
        """Add a step; its name (for later steps' `after`)."""
        if not isinstance(name, str) or not name:
            raise EnqueueError(f"a step's name must be a non-empty string, got {name!r}", "name")
        if name in self._steps:
            raise EnqueueError(f"step {name!r} was added already", "name")
        if isinstance(after, str | bytes) or not isinstance(after, Iterable):
            raise EnqueueError(
                f"after must be a list of step names and job ids, got {after!r}", "after"
            )
        steps: list[str] = []
        ids: list[int] = []
        for parent in after:
            if isinstance(parent, str):
                if parent not in self._steps:
                    raise EnqueueError(
                        f"step {name!r} comes after {parent!r}, which is no step added before it",
                        "after",
                    )
                steps.append(parent)
            else:
                ids.append(parent)
        check_depends_on(ids or None, on_parent_failure, None, None)
        if isinstance(job, JobSpec):
            if payload is not None or options:
                raise EnqueueError("give a JobSpec alone, or a job type with its payload", "job")
            spec = job
        else:
            spec = JobSpec(job, payload, **options)
        if spec.depends_on is not None:
            raise EnqueueError(f"step {name!r}: give its parents in `after`", "depends_on")
        self._steps[name] = _Step(
            name,
            spec,
            tuple(dict.fromkeys(steps)),
            tuple(dict.fromkeys(ids)),
            on_parent_failure,
        )
        return name

    def __len__(self) -> int:
        return len(self._steps)

    def graph(self, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> list[GraphJob]:
        """The steps as a graph to insert, each checked as enqueue checks a job."""
        steps = list(self._steps.values())
        position = {step.name: n for n, step in enumerate(steps)}
        prepared = _prepare_all(
            [_unkeyed(step.name, step.spec) for step in steps], max_payload_bytes
        )
        return [
            GraphJob(
                job,
                tuple(position[p] for p in step.after),
                step.external,
                step.on_parent_failure,
            )
            for step, job in zip(steps, prepared, strict=True)
        ]


def _unkeyed(name: str, spec: JobSpec) -> JobSpec:
    """A step or batch member takes no ordering or dedupe key (enqueue_checks.check_depends_on)."""
    if spec.ordering_key is not None or spec.dedupe_key is not None:
        raise EnqueueError(
            f"{name!r}: a job of a workflow or batch cannot take an ordering_key or a dedupe_key",
            "ordering_key" if spec.ordering_key is not None else "dedupe_key",
        )
    return spec


def _ids(wf: Workflow, ids: Sequence[int], source: Any) -> dict[str, JobHandle]:
    return {name: JobHandle(i, source) for name, i in zip(wf._steps, ids, strict=True)}


async def enqueue_workflow(
    target: AsyncTarget, workflow: Workflow, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> dict[str, JobHandle]:
    """Enqueue every step of `workflow`, all or none; each step's job id (a JobHandle), by step
    name."""
    return _ids(workflow, await graph_async(target, workflow.graph(max_payload_bytes)), target)


def enqueue_workflow_sync(
    target: SyncTarget, workflow: Workflow, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> dict[str, JobHandle]:
    return _ids(workflow, graph_sync(target, workflow.graph(max_payload_bytes)), target)


@dataclass(frozen=True, slots=True)
class BatchIds:
    """An enqueued batch: its id (the callback job's id, `jobs list --batch`: a JobHandle that
    awaits the callback) and its jobs' ids."""

    batch_id: JobHandle
    job_ids: list[int] = field(default_factory=list)


def _batch_graph(
    jobs: Iterable[JobSpec], callback: JobSpec, max_payload_bytes: int
) -> list[GraphJob]:
    """The members, then the callback: after all of them, whatever their outcome ('run'), its
    payload a JSON object that gets the batch's "batch": {"id", "counts"} as members end."""
    members = [_unkeyed(f"job #{n}", spec) for n, spec in enumerate(jobs)]
    if not all(isinstance(spec, JobSpec) for spec in members):
        raise EnqueueError("a batch's jobs must be JobSpecs", "jobs")
    if not isinstance(callback, JobSpec):
        raise EnqueueError("a batch's callback must be a JobSpec", "callback")
    if callback.payload is None:
        callback = replace(callback, payload={})
    if not isinstance(callback.payload, Mapping):
        raise EnqueueError(
            "a batch's callback takes a JSON object as its payload (the batch's counts go in it)",
            "callback",
        )
    if callback.depends_on is not None or any(s.depends_on is not None for s in members):
        raise EnqueueError("a batch's jobs and callback take no depends_on", "depends_on")
    prepared = list(_prepare_all([*members, _unkeyed("callback", callback)], max_payload_bytes))
    last = len(members)
    graph = [GraphJob(job, batch=last) for job in prepared[:last]]
    graph.append(GraphJob(prepared[last], tuple(range(last)), (), "run", last))
    return graph


def _batch_ids(ids: list[int], source: Any) -> BatchIds:
    return BatchIds(JobHandle(ids[-1], source), ids[:-1])


async def enqueue_batch(
    target: AsyncTarget,
    jobs: Iterable[JobSpec],
    callback: JobSpec,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> BatchIds:
    """Enqueue `jobs` and `callback`, which runs once, after the last of them has finished
    (completed, failed, discarded or cancelled), with {"batch": {"id": ..., "counts":
    {"completed": n, "failed": n, "discarded": n, "cancelled": n}}} merged into its payload. All
    or none."""
    return _batch_ids(
        await graph_async(target, _batch_graph(jobs, callback, max_payload_bytes)), target
    )


def enqueue_batch_sync(
    target: SyncTarget,
    jobs: Iterable[JobSpec],
    callback: JobSpec,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> BatchIds:
    return _batch_ids(graph_sync(target, _batch_graph(jobs, callback, max_payload_bytes)), target)
