"""dispatcher.testing with typed tasks: `perform_job`, `assert_enqueued` given a task, and
`current_job()` under the Runner."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatcher import (
    EnqueueError,
    Job,
    PermanentJobError,
    Registry,
    Snooze,
    current_job,
)
from dispatcher.testing import (
    MemoryStore,
    Runner,
    aperform_job,
    assert_enqueued,
    enqueued,
    perform_job,
    refute_enqueued,
)

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
