"""Random sequences of what happens to keyed jobs, replayed on a store with ordering keys' rules
checked after every step: tests/unit/test_ordering_property.py (MemoryStore, many examples) and
tests/contract/test_ordering_replay.py (the same steps on PostgreSQL's JobStore and MemoryStore,
step by step alike).

A step is a tuple: ("enqueue", key or None, priority), ("enqueue_many", [key or None, ...]),
("claim", limit, partitioned), ("complete" | "release", n), ("fail", n, how) on the n-th running
job (mod how many there are), and the operator's ("cancel", n) of any job and ("retry_halted" |
"cancel_halted", n) of a halted key's failed job. The rules, after every step:
- at most one holder per key: a job queued or running, or failed and halting the key;
- a key's holder is its lowest unfinished job: nothing of the key before it is unfinished and
  every job waiting behind it has a higher id; a key with waiting jobs has a holder;
- a claim takes exactly the first `limit` queued jobs in (priority, run_at, id) order, so never a
  waiting job, a job of a halted key, or a job while an earlier job of its key is unfinished;
- a key's jobs are claimed for the first time in id order.
At the end every job is driven to its end (claim and complete until nothing is claimable): what is
left unfinished must wait behind a halted key.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from hypothesis import strategies as st

from dispatcher.constants import NUM_BUCKETS
from dispatcher.db.port import JobStorePort
from dispatcher.db.rows import Failure
from dispatcher.model import (
    STATUS_DISCARDED,
    STATUS_FAILED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    STATUS_WAITING,
    Job,
    Outcome,
)

KEYS = ("k0", "k1", "k2")
LIVE = (STATUS_QUEUED, STATUS_RUNNING, STATUS_WAITING)
EVERY_BUCKET = list(range(NUM_BUCKETS))
LEASE_S = 300.0  # no lease runs out during a replay
FAILURES = {  # how -> (the outcome written, whether it halts a keyed job's key)
    "retry": (Outcome(STATUS_QUEUED, 0.0, "boom"), True),
    "failed": (Outcome(STATUS_FAILED, 0.0, "boom"), True),
    "discarded": (Outcome(STATUS_DISCARDED, 0.0, "boom"), True),
    "continue": (Outcome(STATUS_FAILED, 0.0, "boom"), False),  # on_ordered_failure="continue"
}
OPERATOR_STEPS = ("cancel", "retry_halted", "cancel_halted")

Step = tuple[Any, ...]


def steps(*, operator: bool = True, max_size: int = 40) -> st.SearchStrategy[list[Step]]:
    """Sequences of steps; `operator`: with cancels and retries of halted jobs."""
    key = st.sampled_from([*KEYS, None])
    pick = st.integers(0, 15)
    kinds = [
        st.tuples(st.just("enqueue"), key, st.sampled_from([0, 1])),
        st.tuples(st.just("enqueue"), key, st.just(0)),  # enqueues weigh double
        # Keyed jobs only: PostgreSQL's keyed batch numbers each key's first job before the rest
        # (jobs_stage_publish_keyed), so a batch mixing keyed and unkeyed jobs gets ids in
        # another order than MemoryStore's, and claims cut by `limit` would differ.
        st.tuples(st.just("enqueue_many"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)),
        st.tuples(st.just("claim"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("complete"), pick),
        st.tuples(st.just("fail"), pick, st.sampled_from(sorted(FAILURES))),
        st.tuples(st.just("release"), pick),
    ]
    if operator:
        kinds += [st.tuples(st.just(name), pick) for name in OPERATOR_STEPS]
    return st.lists(st.one_of(*kinds), max_size=max_size)


@dataclass(frozen=True)
class Row:
    id: int
    key: str | None
    status: str
    halted: bool
    priority: int
    run_at: datetime


class Target(Protocol):
    """One store under test, its jobs in one queue (`queue`)."""

    store: JobStorePort
    queue: str

    async def enqueue(self, keys: list[str | None], priority: int) -> None: ...

    async def rows(self) -> list[Row]: ...  # the queue's jobs, by id

    async def retry(self, job_id: int) -> None: ...  # the operator's `jobs retry --id`

    async def tick(self) -> None: ...  # time passes between steps


def holder_problems(rows: list[Row]) -> list[str]:
    """Breaches of the holder rules in one view of the table."""
    problems = []
    by_key: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.halted and row.status not in (STATUS_FAILED, STATUS_DISCARDED):
            problems.append(f"job {row.id} halts its key but is {row.status}")
        if row.key is not None:
            by_key[row.key].append(row)
    for key, jobs in by_key.items():
        holders = [r for r in jobs if r.status in (STATUS_QUEUED, STATUS_RUNNING) or r.halted]
        waiting = [r.id for r in jobs if r.status == STATUS_WAITING]
        if len(holders) > 1:
            problems.append(f"key {key} has {len(holders)} holders: {holders}")
        elif holders:
            holder = holders[0]
            earlier = [r.id for r in jobs if r.id < holder.id and (r.status in LIVE or r.halted)]
            if earlier or any(i < holder.id for i in waiting):
                problems.append(
                    f"key {key}: holder {holder.id} is not its lowest unfinished job: {jobs}"
                )
        elif waiting:
            problems.append(f"key {key}: jobs {waiting} wait and nothing holds the key")
    return problems


def claim_problems(before: list[Row], claimed: list[Job], limit: int) -> list[str]:
    """A claim must take the first `limit` queued jobs in claim order (every job here is due)."""
    expected = [
        r.id
        for r in sorted(
            (r for r in before if r.status == STATUS_QUEUED),
            key=lambda r: (r.priority, r.run_at, r.id),
        )[:limit]
    ]
    got = sorted(job.id for job in claimed)
    return (
        []
        if got == sorted(expected)
        else [f"claimed {got}, expected {sorted(expected)} of {before}"]
    )


def _nth(items: list[Any], n: int) -> Any:
    return items[n % len(items)] if items else None


async def replay(target: Target, sequence: list[Step]) -> list[Any]:
    """Run `sequence`, then drive every job to its end, checking the rules after each step.
    Returns what each step saw (claims and rows, ids as ranks in enqueue order), so that two
    stores' replays can be compared."""
    store = target.store
    running: dict[int, Job] = {}  # claimed by this replay and not yet ended by it
    first_claims: dict[str, list[int]] = defaultdict(list)
    claimed_ever: set[int] = set()
    trace: list[Any] = []

    async def claim(limit: int, partitioned: bool) -> list[Job]:
        before = await target.rows()
        jobs = (
            await store.jobs_claim(
                target.queue, limit, LEASE_S, EVERY_BUCKET if partitioned else None
            )
        ).jobs
        problems = claim_problems(before, jobs, limit)
        assert not problems, problems
        for job in sorted(jobs, key=lambda j: j.id):
            running[job.id] = job
            if job.id not in claimed_ever and job.ordering_key is not None:
                first_claims[job.ordering_key].append(job.id)
            claimed_ever.add(job.id)
        return jobs

    async def step(op: str, *args: Any) -> Any:
        mine = [running[i] for i in sorted(running)]
        if op == "enqueue":
            await target.enqueue([args[0]], args[1])
        elif op == "enqueue_many":
            await target.enqueue(args[0], 0)
        elif op == "claim":
            return sorted(job.id for job in await claim(*args))
        elif op in ("complete", "fail", "release") and (job := _nth(mine, args[0])) is not None:
            del running[job.id]
            if op == "complete":
                return (
                    await store.jobs_complete(
                        [job.id], [job.token], keyed=job.ordering_key is not None
                    )
                ).completed
            if op == "release":
                return await store.jobs_release_owned([job])
            outcome, halts = FAILURES[args[1]]
            written = await store.jobs_fail_owned(
                [Failure(job.id, job.token, outcome, halts=halts)]
            )
            return [(w.status, w.ordering_halted) for w in written]
        elif op == "cancel" and (row := _nth(await target.rows(), args[0])) is not None:
            return await store.jobs_cancel([row.id])  # a running job keeps running, with a request
        elif op in ("retry_halted", "cancel_halted"):
            halted = [r for r in await target.rows() if r.halted]
            if (row := _nth(halted, args[0])) is not None:
                await (
                    target.retry(row.id) if op == "retry_halted" else store.jobs_cancel([row.id])
                )
        return None

    for op, *args in sequence:
        await target.tick()
        seen = await step(op, *args)
        rows = await target.rows()
        problems = holder_problems(rows)
        assert not problems, (op, args, problems)
        trace.append((op, _named(seen, rows), _statuses(rows)))

    for _ in range(len(sequence) * 4 + 10):  # the drain: each round ends at least one job, or stops
        await target.tick()
        for job in sorted(running.values(), key=lambda j: j.id):
            await store.jobs_complete([job.id], [job.token], keyed=job.ordering_key is not None)
        running.clear()
        if not await claim(100, False):
            break
        assert not holder_problems(await target.rows())
    rows = await target.rows()
    assert not running
    halted_keys = {r.key for r in rows if r.halted}
    stuck = [r for r in rows if r.status in LIVE and r.key not in halted_keys]
    assert not stuck, f"jobs left unfinished behind no halted key: {stuck}"
    assert all(ids == sorted(ids) for ids in first_claims.values()), (
        f"a key's claims out of id order: {first_claims}"
    )
    trace.append(("drained", _statuses(rows)))
    return trace


def _names(rows: list[Row]) -> dict[int, tuple[str, int]]:
    """Each job's name in both stores: (its key or "-", how many jobs of that key came before it).
    Ids are no name: each store numbers jobs its own way (one database, many queues)."""
    counts: dict[str, int] = defaultdict(int)
    names = {}
    for row in rows:
        key = row.key or "-"
        names[row.id] = (key, counts[key])
        counts[key] += 1
    return names


def _statuses(rows: list[Row]) -> list[tuple[tuple[str, int], str, bool]]:
    names = _names(rows)
    return sorted((names[r.id], r.status, r.halted) for r in rows)


def _named(seen: Any, rows: list[Row]) -> Any:
    """What a step returned, with job ids as names (a claim's ids; a cancel's statuses)."""
    if isinstance(seen, list) and all(isinstance(i, int) for i in seen):
        names = _names(rows)
        return sorted(names[i] for i in seen)
    if isinstance(seen, dict):
        return sorted(seen.values())
    return seen
