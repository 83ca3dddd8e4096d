"""The producer's claim decisions against a fake store: when a backlog goes on, which buckets each
claim reads (claim windows), and when it steals. The store's SQL is tested against PostgreSQL in
tests/integration/test_claim.py; here only the decisions, fast."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from coordinator.assignment import StaticAssignment
from dispatcher.db.rows import Claimed, FlowState
from dispatcher.errors import StoreUnavailable
from dispatcher.model import Job
from dispatcher.runtime.claim_windows import MAX_WINDOW_BUCKETS, ClaimWindows, window_buckets
from dispatcher.runtime.producer import Producer
from dispatcher.runtime.stealing import MAX_VICTIMS
from dispatcher.runtime.vitals import Vitals
from dispatcher.settings.config import Config
from dispatcher.settings.sections import ClaimSettings
from tests.helpers import run_async, wait_until_async

ALL = tuple(range(64))


class FakeStore:
    """Buckets hold `queued[b]` jobs. A claim takes them in bucket order from the buckets asked;
    `stolen_by_others` jobs of each selection are taken by someone else first (a stealer)."""

    def __init__(self, queued: dict[int, int], stolen_by_others: int = 0) -> None:
        self.queued = dict(queued)
        self.stolen_by_others = stolen_by_others
        self.claims: list[tuple[tuple[int, ...] | None, int, bool]] = []  # (buckets, limit, steal)
        self.next_id = 1

    def note_ready(self, queue, bucket=None):
        pass

    async def jobs_next_due_in(self, queue, buckets):
        return None

    async def flow_state(self):
        return FlowState()

    async def jobs_claim(self, queue, limit, lease_s, buckets, steal=None, **flow):
        steal_from = steal.buckets if steal is not None else None
        self.claims.append((steal_from if steal is not None else buckets, limit, steal is not None))
        await asyncio.sleep(0)
        readable = (
            steal_from if steal_from is not None else (buckets if buckets is not None else ALL)
        )
        selected = []
        for b in readable:
            while self.queued.get(b, 0) and len(selected) < limit:
                self.queued[b] -= 1
                selected.append(b)
        lost = 0 if steal_from is not None else min(self.stolen_by_others, len(selected))
        jobs = []
        for b in selected[lost:]:
            jobs.append(
                Job(
                    id=self.next_id,
                    job_type="noop",
                    payload={},
                    attempts=1,
                    max_attempts=5,
                    locked_at=None,
                    bucket=b,
                    priority=0,
                    ordering_key=None,
                    token="00000000-0000-0000-0000-000000000001",
                )
            )
            self.next_id += 1
        return Claimed(jobs, len(selected))

    def left(self) -> int:
        return sum(self.queued.values())


class FakeExecutor:
    """Runs every job at once: slots free as soon as a claim's jobs start."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.slot_freed = asyncio.Event()
        self.started = 0

    def start(self, jobs, sent_at) -> None:
        self.started += len(jobs)


async def drive(
    store: FakeStore,
    own: tuple[int, ...],
    *,
    until,
    steal: bool = True,
    timeout_s: float = 5.0,
    **settings,
) -> Producer:
    """Run a producer over `own` until `until(store)` holds or `timeout_s` passes (a failure)."""
    config = Config(
        dsn="postgresql://x",
        batch_size=500,
        steal=steal,
        **{"concurrency": 100, "poll_interval_s": 30.0, **settings},
    )
    producer = Producer(config.claims, store, {"default": StaticAssignment(own)}, FakeExecutor())
    task = asyncio.create_task(producer.run())
    try:
        async with asyncio.timeout(timeout_s):
            while not until(store):
                await asyncio.sleep(0.001)
    finally:
        producer.stop()
        await asyncio.wait_for(task, 5)
    return producer


def test_a_claim_that_lost_rows_to_others_is_still_a_backlog():
    asyncio.run(_test_a_claim_that_lost_rows_to_others_is_still_a_backlog())


async def _test_a_claim_that_lost_rows_to_others_is_still_a_backlog():
    """Every selection loses 10 rows to a stealer: the owner must keep claiming, not sleep for the
    30 s poll interval while its buckets still hold jobs."""
    store = FakeStore({b: 1000 for b in range(0, 64, 2)}, stolen_by_others=10)
    await drive(store, tuple(range(0, 64, 2)), until=lambda s: s.left() == 0, steal=False)
    assert store.left() == 0


@pytest.mark.parametrize("concurrency, window", [(100, 2), (500, 8)])
def test_a_backlog_claims_one_window_at_a_time_and_visits_every_bucket(concurrency, window):
    asyncio.run(
        _test_a_backlog_claims_one_window_at_a_time_and_visits_every_bucket(concurrency, window)
    )


async def _test_a_backlog_claims_one_window_at_a_time_and_visits_every_bucket(concurrency, window):
    """A backlog's claims take a quarter of the slots (25 at the default concurrency 100, 125 at
    500); the window holds ~16 jobs' worth of buckets: 2 and 8."""
    own = tuple(range(0, 64, 2))  # 32 buckets: 16 windows of 2, or 4 of 8
    store = FakeStore({b: 400 for b in own})
    await drive(store, own, until=lambda s: s.left() == 0, steal=False, concurrency=concurrency)
    first, *rest = [c for c in store.claims if not c[2]]
    assert first[0] == own  # out of a backlog: all our buckets
    windows = [c[0] for c in rest if c[0] != own]
    assert windows and all(len(w) == window for w in windows)
    assert set().union(*windows) == set(own)
    read = Counter(b for w in windows for b in w)
    assert max(read.values()) - min(read.values()) <= 2  # even rotation


def test_short_windows_end_the_backlog_only_after_a_whole_round():
    asyncio.run(_test_short_windows_end_the_backlog_only_after_a_whole_round())


async def _test_short_windows_end_the_backlog_only_after_a_whole_round():
    """Only one bucket of 32 has jobs: windows without it come back short, yet the claims go on
    until its window is read, and then a claim over all buckets ends the backlog."""
    own = tuple(range(32))
    store = FakeStore({31: 5000})
    await drive(store, own, until=lambda s: s.left() == 0, steal=False)
    assert store.left() == 0


def test_no_steal_while_a_window_comes_back_short():
    asyncio.run(_test_no_steal_while_a_window_comes_back_short())


async def _test_no_steal_while_a_window_comes_back_short():
    own = tuple(range(32))
    store = FakeStore({**{b: 300 for b in own}, **{b: 300 for b in range(32, 64)}})
    await drive(store, own, until=lambda s: all(s.queued[b] == 0 for b in own))
    steals_after_a_window = [
        i
        for i, c in enumerate(store.claims)
        if c[2] and i > 0 and store.claims[i - 1][0] not in (own,)
    ]
    assert not steals_after_a_window


def test_when_our_buckets_run_dry_the_worker_steals_without_sleeping_first():
    """A skewed backlog: our 32 buckets hold a few jobs, the other 32 many. Once a round of
    windows comes back short, a claim over all our buckets comes back short too and the worker
    steals in the same cycle; sleeping first would cost the whole 30 s poll interval."""
    asyncio.run(_test_when_our_buckets_run_dry_the_worker_steals_without_sleeping_first())


async def _test_when_our_buckets_run_dry_the_worker_steals_without_sleeping_first():
    own = tuple(range(32))
    store = FakeStore({**{b: 5 for b in own}, **{b: 1000 for b in range(32, 64)}})
    await drive(store, own, until=lambda s: s.left() == 0)
    assert store.left() == 0


def test_a_steal_sweeps_every_other_bucket_in_budgeted_statements_until_one_finds_jobs():
    asyncio.run(
        _test_a_steal_sweeps_every_other_bucket_in_budgeted_statements_until_one_finds_jobs()
    )


async def _test_a_steal_sweeps_every_other_bucket_in_budgeted_statements_until_one_finds_jobs():
    """One hot bucket among 56 others, nothing of our own: each steal statement visits at most
    MAX_VICTIMS buckets, each leaves the owner its claim's worth (min(batch, concurrency)), and
    the steal goes on through the sweep in the same cycle (poll 30 s: a sleep would time out)."""
    reserves = []

    class Recording(FakeStore):
        async def jobs_claim(self, queue, limit, lease_s, buckets, steal=None, **flow):
            if steal is not None:
                reserves.append(steal.reserve)
            return await super().jobs_claim(queue, limit, lease_s, buckets, steal)

    own = tuple(range(8))
    store = Recording({63: 3000})
    await drive(store, own, until=lambda s: s.left() == 0)
    steals = [c for c in store.claims if c[2]]
    assert all(
        len(buckets) <= MAX_VICTIMS and not set(buckets) & set(own) for buckets, _, _ in steals
    )
    assert set(reserves) == {100}, "the owner's claim: min(batch_size 500, concurrency 100)"


@pytest.mark.parametrize(
    "owned, windowed", [(8, False), (9, True), (32, True), (63, True), (64, False)]
)
def test_windows_only_where_more_buckets_than_a_window_and_not_every_bucket(owned, windowed):
    """Every bucket is one walk of the queue-wide index (claim_select_all_buckets): no window."""
    windows = ClaimWindows(MAX_WINDOW_BUCKETS)
    buckets, is_window = windows.pick("q", tuple(range(owned)))
    assert is_window == windowed
    assert len(buckets) <= MAX_WINDOW_BUCKETS if windowed else buckets == tuple(range(owned))


@pytest.mark.parametrize(
    "claim_size, window", [(1, 2), (25, 2), (32, 2), (33, 3), (48, 3), (125, 8), (500, 8)]
)
def test_a_window_holds_about_16_jobs_worth_of_buckets_from_2_to_8(claim_size, window):
    assert window_buckets(claim_size) == window


def test_sizes_that_cannot_be_are_refused():
    with pytest.raises(ValueError, match="at least 1 job"):
        window_buckets(0)
    with pytest.raises(ValueError, match="at least 1 bucket"):
        ClaimWindows(0)


def test_a_full_window_resets_the_count_of_short_ones():
    windows = ClaimWindows(8)
    own = tuple(range(32))  # 4 windows
    for _ in range(3):
        assert windows.pick("q", own)[1]
        windows.record("q", full=False)
    assert windows.pick("q", own)[1]
    windows.record("q", full=True)
    for _ in range(4):
        assert windows.pick("q", own)[1]
        windows.record("q", full=False)
    # Four short in a row: the next claim reads every bucket (it decides the backlog), then windows
    # again.
    assert windows.pick("q", own) == (own, False)
    assert windows.pick("q", own)[1]


def test_degraded_and_skip_locked_claims_are_never_windowed():
    assert ClaimWindows(2).pick("q", None) == (None, False)


def test_poll_wake_ups_look_ahead_at_most_once_a_second():
    asyncio.run(_test_poll_wake_ups_look_ahead_at_most_once_a_second())


async def _test_poll_wake_ups_look_ahead_at_most_once_a_second():
    """Idle, polling every 20 ms: every poll claims, but only about one a second looks ahead (the
    look-ahead walks the queue-wide index from its start). Before: one look-ahead per poll."""

    class CountingStore(FakeStore):
        look_aheads = 0

        async def jobs_next_due_in(self, queue, buckets):
            self.look_aheads += 1
            return None

    store = CountingStore({})
    started = time.monotonic()
    await drive(
        store, ALL[:8], until=lambda s: len(s.claims) >= 15, poll_interval_s=0.02, steal=False
    )
    elapsed_s = time.monotonic() - started
    # One at start-up, then at most one per started second of polling.
    assert 1 <= store.look_aheads <= 2 + int(elapsed_s), (
        store.look_aheads,
        len(store.claims),
        elapsed_s,
    )


def test_no_look_ahead_during_a_backlog_and_one_before_sleeping():
    asyncio.run(_test_no_look_ahead_during_a_backlog_and_one_before_sleeping())


async def _test_no_look_ahead_during_a_backlog_and_one_before_sleeping():
    """Assignment changes and bulk NOTIFYs during a backlog each ask for a look-ahead; none is
    taken while the backlog lasts (the next claim comes at once anyway), and the one left is
    taken after the backlog's last claim, before the loop sleeps."""
    events: list[str] = []
    assignment = StaticAssignment(ALL[:8])
    producer: Producer

    class RecordingStore(FakeStore):
        async def jobs_next_due_in(self, queue, buckets):
            events.append("look")
            return None

        async def jobs_claim(self, queue, limit, lease_s, buckets, steal=None, **flow):
            claimed = await super().jobs_claim(queue, limit, lease_s, buckets, steal)
            events.append("full" if claimed.selected >= limit else "short")
            if len(events) % 5 == 0:
                assignment.changed.set()  # as a rebalance does
                producer.on_notify("default", None)  # a bulk enqueue
            return claimed

    store = RecordingStore({b: 1000 for b in ALL[:8]})
    config = Config(
        dsn="postgresql://x", concurrency=100, batch_size=500, steal=False, poll_interval_s=30.0
    )
    producer = Producer(config.claims, store, {"default": assignment}, FakeExecutor())
    task = asyncio.create_task(producer.run())
    try:
        async with asyncio.timeout(5):
            while not (store.left() == 0 and producer.idle):
                await asyncio.sleep(0.001)
    finally:
        producer.stop()
        await asyncio.wait_for(task, 5)
    full = events.count("full")
    assert full >= 80  # 8000 jobs, 100 a claim: a long backlog with ~16 change signals in it
    assert events[0] == "look"  # start-up: jobs may be scheduled already
    assert "look" not in events[1 : events.index("short")]  # none during the backlog
    assert (
        events[events.index("short") :].count("look") == 1
    )  # the one left, once the backlog ended
    assert events[-2:] == ["look", "short"]  # ... taken before the claim the loop sleeps after


# -- its section and the worker's vitals -----------------------------------------------------------


class Pauses(Producer):
    """Counts the producer's pauses (a stalled check, a back-off), each 1 ms here."""

    STALLED_CHECK_S = 0.001
    pauses = 0

    async def _pause(self, seconds: float) -> None:
        self.pauses += 1
        await super()._pause(min(seconds, 0.001))


class FailsFirst(FakeStore):
    """Its first `failures` claims fail; each claim notes what the vitals said when it came."""

    def __init__(self, queued: dict[int, int], failures: int, vitals: Vitals) -> None:
        super().__init__(queued)
        self.failures = failures
        self.vitals = vitals
        self.failing_since_seen: list[float | None] = []

    async def jobs_claim(self, queue, limit, lease_s, buckets, steal=None, **flow):
        self.failing_since_seen.append(self.vitals.claims_failing_since)
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("claim: database unavailable")
        return await super().jobs_claim(queue, limit, lease_s, buckets, steal)


def test_the_producer_takes_its_claim_section_and_claims_nothing_while_the_vitals_say_stalled():
    claims = ClaimSettings(
        mode="partitioned",
        queues=("default",),
        concurrency=10,
        batch_size=5,
        poll_interval_s=30.0,
        lease_s=12.0,
        steal=False,
        steal_batch=1,
    )
    vitals = Vitals(heartbeats_failing_since=time.monotonic())  # the lease keeper's heartbeats fail
    store = FakeStore({0: 3})

    async def main() -> None:
        producer = Pauses(
            claims, store, {"default": StaticAssignment(ALL)}, FakeExecutor(), vitals=vitals
        )
        task = asyncio.create_task(producer.run())
        try:
            await wait_until_async(lambda: producer.pauses >= 3, 5, "three stalled checks")
            assert store.claims == []  # leases it could not extend: nothing claimed
            vitals.heartbeats_failing_since = None
            await wait_until_async(
                lambda: store.left() == 0, 5, "the claim once heartbeats work again"
            )
        finally:
            producer.stop()
            await asyncio.wait_for(task, 5)
        assert store.claims[0] == (ALL, 5, False)  # the section's batch size

    run_async(main())


def test_failing_claims_are_written_to_the_vitals_until_one_works():
    claims = Config(dsn="postgresql://x", poll_interval_s=30.0, steal=False).claims
    vitals = Vitals()
    store = FailsFirst({0: 3}, failures=2, vitals=vitals)

    async def main() -> None:
        producer = Pauses(
            claims, store, {"default": StaticAssignment(ALL)}, FakeExecutor(), vitals=vitals
        )
        task = asyncio.create_task(producer.run())
        try:
            await wait_until_async(lambda: store.left() == 0, 5, "the claim after two failures")
        finally:
            producer.stop()
            await asyncio.wait_for(task, 5)
        first, second, third = store.failing_since_seen[:3]
        assert first is None and second is not None and third == second  # since the first failure
        # it works again
        assert vitals.claims_failing_since is None and vitals.failing_since is None

    run_async(main())
