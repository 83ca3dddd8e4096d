"""dispatcher.testing with typed tasks and schedules: `perform_job`, `assert_enqueued` given a
task, `current_job()` under the Runner, and the registry's schedules enqueued as the fake clock
moves."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import (
    EnqueueError,
    Job,
    PermanentJobError,
    Registry,
    Snooze,
    current_job,
    enqueue_sync,
)
from dispatcher.testing import (
    FakeClock,
    MemoryStore,
    Runner,
    aperform_job,
    assert_enqueued,
    enqueued,
    perform_job,
    refute_enqueued,
)
from dispatcher.testing.schedules import MAX_SLOTS

T0 = datetime(2030, 1, 1, tzinfo=UTC)
registry = Registry()
seen: list[tuple[Any, ...]] = []


@registry.task(queue="emails", max_attempts=3)
async def send_email(to: str, subject: str = "Hello") -> str:
    job = current_job()
    seen.append((to, subject, job.job_type, job.queue, job.attempts, job.max_attempts))
    if to == "busy":
        raise Snooze(30)
    return f"sent to {to}"


@registry.task()
def charge(cents: int) -> int:
    seen.append(("charge", cents, threading.current_thread().name, current_job().priority))
    if cents < 0:
        raise PermanentJobError("a negative charge")
    return cents


@registry.handler("legacy")
def legacy(job: Job) -> str:
    seen.append(("legacy", job.payload, job.attempts, job.scheduled_for, current_job() is job))
    return "done"


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


# -- perform_job ----------------------------------------------------------------------------------


def test_perform_job_runs_a_tasks_function_with_a_job_built_for_it() -> None:
    assert perform_job(send_email, "ada@example.com") == "sent to ada@example.com"
    assert seen == [("ada@example.com", "Hello", "send_email", "emails", 1, None)]
    assert perform_job(charge.with_options(priority=5), 250) == 250
    assert seen[-1] == ("charge", 250, threading.current_thread().name, 5)  # in this thread


def test_perform_job_raises_what_the_handler_raises() -> None:
    with pytest.raises(PermanentJobError, match="negative"):
        perform_job(charge, -1)
    with pytest.raises(Snooze):
        perform_job(send_email, "busy")


def test_perform_job_checks_the_arguments_as_enqueue_does() -> None:
    with pytest.raises(EnqueueError, match="argument 'cents' must be int"):
        perform_job(charge, "ten")  # type: ignore[arg-type]
    assert seen == []


def test_perform_job_runs_a_job_type_of_a_registry_with_its_payload_and_job_fields() -> None:
    slot = T0 + timedelta(hours=3)
    assert perform_job(registry, "legacy", {"n": 1}, attempt=3, scheduled_for=slot) == "done"
    assert seen == [("legacy", {"n": 1}, 3, slot, True)]
    assert perform_job(registry, "charge", {"cents": 7}) == 7  # a task's job, by its job type
    with pytest.raises(LookupError, match="no handler registered for job_type 'nope'"):
        perform_job(registry, "nope")


def test_the_payload_travels_as_json_as_it_does_to_a_worker() -> None:
    perform_job(registry, "legacy", {"pair": (1, 2)})
    assert seen == [("legacy", {"pair": [1, 2]}, 1, None, True)]


def test_perform_job_inside_an_event_loop_says_to_await_aperform_job() -> None:
    async def inside() -> None:
        with pytest.raises(RuntimeError, match="await aperform_job"):
            perform_job(send_email, "a")
        assert await aperform_job(send_email, "a", "Hi") == "sent to a"
        assert await aperform_job(charge, 3) == 3  # a sync one: in a thread, as a worker runs it
        assert await aperform_job(registry, "legacy", None) == "done"

    asyncio.run(inside())
    assert seen[0] == ("a", "Hi", "send_email", "emails", 1, None)
    assert seen[1][2] != threading.current_thread().name


@pytest.fixture
def anyio_backend() -> str:
    """The dispatcher's async forms run on asyncio (anyio would also try trio where installed)."""
    return "asyncio"


@pytest.mark.anyio
async def test_an_async_test_awaits_the_async_forms() -> None:
    """As docs/guides/testing.md says: anyio's pytest plugin runs an `async def` test."""
    store = MemoryStore()
    await send_email.enqueue(store, "ada@example.com")
    [attempt] = await Runner(store, registry).adrain()
    assert attempt.status == "completed"
    assert await aperform_job(send_email, "b") == "sent to b"


# -- assertions with tasks ------------------------------------------------------------------------


def test_assert_enqueued_takes_a_task_for_its_job_type() -> None:
    store = MemoryStore()
    send_email.enqueue_sync(store, "ada@example.com", subject="Welcome")
    job = assert_enqueued(store, send_email, {"to": "ada@example.com"}, queue="emails", count=1)
    assert job.payload == send_email.payload("ada@example.com", subject="Welcome")
    assert [j.id for j in enqueued(store, send_email)] == [job.id]
    refute_enqueued(store, charge)
    with pytest.raises(AssertionError, match="expected a queued 'charge' job"):
        assert_enqueued(store, charge)
    with pytest.raises(AssertionError, match="expected no 'send_email' job"):
        refute_enqueued(store, send_email)


# -- the Runner ---------------------------------------------------------------------------------


def test_under_the_runner_current_job_is_the_job_running() -> None:
    store = MemoryStore()
    charge.with_options(priority=4).enqueue_sync(store, 9)
    send_email.enqueue_sync(store, "busy")
    attempts = Runner(store, registry).run_due()
    assert sorted(a.status for a in attempts) == ["completed", "queued"]
    assert ("busy", "Hello", "send_email", "emails", 1, None) in seen
    [(_, cents, _, priority)] = [s for s in seen if s[0] == "charge"]
    assert (cents, priority) == (9, 4)
    with pytest.raises(RuntimeError, match="only known inside a job's handler"):
        current_job()


def scheduled() -> tuple[MemoryStore, Registry, list[datetime | None]]:
    store, r = MemoryStore(FakeClock(T0)), Registry()
    slots: list[datetime | None] = []

    @r.task(queue="ops")
    def ping(kind: str = "short") -> None:
        slots.append(current_job().scheduled_for)

    r.schedule("heartbeat", every_s=30, job_type="ping", queue="ops", payload={"kind": "long"})
    return store, r, slots


def test_advancing_the_clock_enqueues_each_slot_passed_and_run_due_runs_them() -> None:
    store, r, slots = scheduled()
    runner = Runner(store, r)
    assert runner.run_due() == [] and store.jobs() == []  # the first slot is T0 + 30 s
    runner.advance(65)
    jobs = assert_enqueued(store, "ping", {"kind": "long"}, queue="ops", count=2)
    assert jobs.run_at == T0 + timedelta(seconds=60)
    assert [a.status for a in runner.run_due()] == ["completed", "completed"]
    assert slots == [T0 + timedelta(seconds=30), T0 + timedelta(seconds=60)]
    runner.advance(10)
    assert runner.run_due() == []  # the next slot is T0 + 90 s
    store.clock.advance(20)  # the store's clock moved directly: run_due enqueues the slot too
    assert len(runner.run_due()) == 1 and slots[-1] == T0 + timedelta(seconds=90)


_failed: set[int] = set()


def _fail_first(job: Job) -> None:
    if job.id not in _failed:
        _failed.add(job.id)
        raise ConnectionError("first attempt")


def test_drain_runs_the_slots_it_passes_but_never_waits_for_the_next_one() -> None:
    store, r, slots = scheduled()
    r.handler("retry_once", max_attempts=2)(_fail_first)
    runner = Runner(store, r, rand=lambda: 1.0, retry_base_s=100)
    enqueue_sync(store, "retry_once", queue="ops")
    runner.drain()  # the retry is due 100 s later: the clock passes 3 slots on its way there
    assert store.clock.now() == T0 + timedelta(seconds=100)
    assert slots == [T0 + timedelta(seconds=s) for s in (30, 60, 90)]
    assert runner.drain() == [] and store.clock.now() == T0 + timedelta(seconds=100)


def test_cron_schedules_and_the_runners_queues() -> None:
    store = MemoryStore(FakeClock(T0 + timedelta(minutes=30)))
    r = Registry()
    r.handler("report", schedule="@hourly")(lambda job: None)
    r.schedule("elsewhere", "0 * * * *", job_type="report", queue="other")
    runner = Runner(store, r, queues=["default"])
    runner.advance(3 * 3600)
    assert [j.run_at.hour for j in enqueued(store, "report")] == [1, 2, 3]
    assert enqueued(store, "report", queue="other") == []  # not a queue this runner runs


def test_a_runner_without_schedules_enqueues_none() -> None:
    store, r, _ = scheduled()
    Runner(store, r, schedules=False).advance(3600)
    assert store.jobs() == []


def test_a_jump_past_too_many_slots_is_refused() -> None:
    store, r, _ = scheduled()
    runner = Runner(store, r)
    with pytest.raises(RuntimeError, match=f"schedule 'heartbeat' has over {MAX_SLOTS} slots"):
        runner.advance(30 * (MAX_SLOTS + 1))


@settings(max_examples=50, deadline=None)
@given(
    every_s=st.integers(1, 3600),
    start_s=st.integers(0, 86_400),
    steps=st.lists(st.floats(0, 7200, allow_nan=False), min_size=1, max_size=6),
)
def test_each_slot_passed_gets_one_job_however_the_clock_is_moved(
    every_s: int, start_s: int, steps: list[float]
) -> None:
    start = T0 + timedelta(seconds=start_s)
    store, r = MemoryStore(FakeClock(start)), Registry()
    r.handler("tick")(lambda job: None)
    r.schedule("tick", every_s=every_s, job_type="tick")
    runner = Runner(store, r)
    for step in steps:
        runner.advance(step)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    begin_s, end_s = ((t - epoch).total_seconds() for t in (start, store.clock.now()))
    first = (int(begin_s) // every_s + 1) * every_s  # slots: multiples of every_s since the epoch
    expected = [epoch + timedelta(seconds=n) for n in range(first, int(end_s) + 1, every_s)]
    assert [j.run_at for j in store.jobs()] == expected  # each once, in order
