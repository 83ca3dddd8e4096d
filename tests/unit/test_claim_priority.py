"""Priority within a worker: a claim window's veto (sql/claim.sql, claim_window) and what the
producer does with it, against dispatcher.testing.MemoryStore (the same veto as PostgreSQL's: the
store contract suite holds both to it). No claim of a worker may take a job while a due job of
strictly better priority waits in the buckets it owns."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.assignment import StaticAssignment
from dispatcher import JobSpec, enqueue_many
from dispatcher.db.rows import Claimed, FlowState
from dispatcher.model import STATUS_QUEUED
from dispatcher.runtime.claim_windows import ClaimWindows, beyond_window
from dispatcher.runtime.producer import Producer
from dispatcher.settings.config import Config
from dispatcher.testing import MemoryStore
from tests.helpers import run_async

OWN = tuple(range(0, 64, 2))  # 32 buckets: 16 windows of 2


def test_an_outranked_window_reads_all_buckets_until_the_queues_backlog_ends():
    windows = ClaimWindows(2)
    assert windows.pick("q", OWN) == (OWN[0::16], True)
    windows.outranked("q")
    for _ in range(20):  # however long the backlog lasts
        assert windows.pick("q", OWN) == (OWN, False)
    assert windows.pick("other", OWN)[1], "another queue's windows are its own"
    windows.ended("q")
    buckets, windowed = windows.pick("q", OWN)
    assert windowed and len(buckets) == 2


def test_a_windows_outside_is_the_rest_of_the_owned_buckets_in_order():
    assert beyond_window(OWN, OWN[3::16]) == tuple(b for b in OWN if b not in (6, 38))


class Recorder:
    """The producer's store: a MemoryStore, and every claim with what was due in our buckets
    when it came."""

    def __init__(self, memory: MemoryStore, own: tuple[int, ...]) -> None:
        self.memory = memory
        self.own = set(own)
        # (priorities claimed, the best priority still due in our buckets after the claim)
        self.claims: list[tuple[list[int], int | None]] = []
        self.vetoed = 0

    def note_ready(self, queue, bucket=None):
        pass

    async def jobs_next_due_in(self, queue, buckets):
        return None

    async def flow_state(self):
        return FlowState()

    async def jobs_claim(self, queue, limit, lease_s, buckets, steal=None, *, outside=None, **_):
        claimed: Claimed = self.memory.claim(queue, limit, lease_s, buckets, steal, outside)
        self.vetoed += claimed.outranked
        if steal is None:
            left = [j.priority for j in self.memory.jobs(STATUS_QUEUED) if j.bucket in self.own]
            self.claims.append(([j.priority for j in claimed.jobs], min(left, default=None)))
        await asyncio.sleep(0)
        return claimed

    def own_left(self) -> int:
        return sum(j.bucket in self.own for j in self.memory.jobs(STATUS_QUEUED))


class Executor:
    """Every job ends as it starts: slots are always free."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.slot_freed = asyncio.Event()

    def start(self, jobs, sent_at) -> None:
        pass


async def drain(
    jobs: list[tuple[int, int]], own: tuple[int, ...], concurrency: int, steal: bool
) -> Recorder:
    """(bucket, priority) jobs, enqueued at once; a producer owning `own` claims until its
    buckets are empty."""
    memory = MemoryStore()
    await enqueue_many(memory, [JobSpec("t", priority=p, bucket=b) for b, p in jobs])
    store = Recorder(memory, own)
    config = Config(
        dsn="postgresql://x",
        concurrency=concurrency,
        batch_size=500,
        steal=steal,
        poll_interval_s=30.0,
    )
    producer = Producer(config.claims, store, {"default": StaticAssignment(own)}, Executor())
    task = asyncio.create_task(producer.run())
    try:
        async with asyncio.timeout(10):
            while store.own_left():
                await asyncio.sleep(0.001)
    finally:
        producer.stop()
        await asyncio.wait_for(task, 5)
    return store


def passed_over(store: Recorder) -> list[tuple[list[int], int | None]]:
    """The claims that took a job while one of strictly better priority stayed due in our
    buckets (nothing arrives meanwhile, so it was due when the claim came)."""
    return [
        (took, best)
        for took, best in store.claims
        if took and best is not None and best < max(took)
    ]


@pytest.mark.parametrize("steal", [False, True])
def test_a_mixed_priority_backlog_is_claimed_best_first_across_windows(steal):
    """Claims of 25 (concurrency 100) over 32 buckets: windows of 2. Priorities 0-9 at random:
    a window's best is rarely the worker's, its claim is vetoed, and the rest of the backlog is
    read over all 32 buckets."""
    rng = random.Random(38)
    jobs = [(rng.choice(OWN), rng.randint(0, 9)) for _ in range(2000)]
    jobs += [(b, 0) for b in range(1, 64, 2)]  # not ours
    store = run_async(drain(jobs, OWN, 100, steal))
    assert passed_over(store) == []
    assert store.vetoed >= 1, "the test never reached a window's veto"


def test_uniform_priorities_keep_their_windows():
    """Every job of priority 0: no veto, the backlog's claims read one window at a time."""
    rng = random.Random(38)
    store = run_async(drain([(rng.choice(OWN), 0) for _ in range(2000)], OWN, 100, False))
    assert store.vetoed == 0 and passed_over(store) == []


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[list[tuple[int, int]], tuple[int, ...]]:
    """An owned set of buckets, and up to 400 jobs, most in it, of a few priorities or many.
    The jobs come from a drawn seed: drawn one by one, the lists stayed too short for a backlog."""
    own = tuple(sorted(draw(st.sets(st.integers(0, 63), min_size=1, max_size=64))))
    count, spread = draw(st.integers(1, 400)), draw(st.integers(0, 9))
    rng = random.Random(draw(st.integers(0, 2**32)))
    jobs = [
        (rng.choice(own) if rng.random() < 0.9 else rng.randrange(64), rng.randint(0, spread))
        for _ in range(count)
    ]
    return jobs, own


@settings(max_examples=40, deadline=None)
@given(backlog=backlogs(), concurrency=st.integers(1, 40), steal=st.booleans())
def test_no_claim_passes_a_better_job_of_our_buckets(backlog, concurrency, steal):
    """Any jobs over any buckets, any owned set, any claim size: each claim's worst job is no
    worse than the best one it leaves due in our buckets."""
    jobs, own = backlog
    store = run_async(drain(jobs, own, concurrency, steal))
    assert passed_over(store) == []
