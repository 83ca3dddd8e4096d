"""dispatcher.testing: the in-memory store, the runner and the assertions, as a user's unit test
would use them (no PostgreSQL). The store's own rules are the contract suite's
(tests/contract/test_store_contract.py)."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

import dispatcher
from dispatcher import EnqueueError, JobSpec, PayloadError, PermanentJobError, Registry
from dispatcher.model import FailureKind
from dispatcher.testing import (
    FakeClock,
    MemoryStore,
    Runner,
    assert_enqueued,
    enqueued,
    refute_enqueued,
)
from tests.unit.test_runtime_imports import run_python

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def make(**runner_options) -> tuple[MemoryStore, Registry, Runner]:
    store, registry = MemoryStore(FakeClock(T0)), Registry()
    return store, registry, Runner(store, registry, **runner_options)


def test_the_production_enqueue_calls_write_into_the_store_with_their_options() -> None:
    store, _, _ = make()
    assert (
        dispatcher.enqueue_sync(store, "send", {"to": "a"}, priority=2, delay_s=30, max_attempts=3)
        == 1
    )
    assert asyncio.run(dispatcher.enqueue(store, "send", {"to": "b"}, queue="mail", bucket=7)) == 2
    assert dispatcher.enqueue_many_sync(store, [JobSpec("bulk", {"i": i}) for i in range(3)]) == 3
    assert (
        asyncio.run(dispatcher.enqueue_payloads(store, "bulk", [{"i": 3}, {"i": 4}], run_at=T0))
        == 2
    )
    assert dispatcher.enqueue_payloads_sync(store, "bulk", [{"i": 5}], partition_keys=["k"]) == 1
    first = store.get(1)
    assert first is not None
    assert (first.priority, first.max_attempts, first.run_at) == (2, 3, T0 + timedelta(seconds=30))
    second = store.get(2)
    assert second is not None and (second.queue, second.bucket, second.payload) == (
        "mail",
        7,
        {"to": "b"},
    )
    assert [j.payload["i"] for j in enqueued(store, "bulk")] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("call", "error", "option"),
    [
        (lambda s: dispatcher.enqueue_sync(s, "bad type!"), EnqueueError, "job_type"),
        (lambda s: dispatcher.enqueue_sync(s, "a", delay_s=float("inf")), EnqueueError, "delay_s"),
        (lambda s: dispatcher.enqueue_sync(s, "a", max_attempts=1.5), EnqueueError, "max_attempts"),
        (lambda s: dispatcher.enqueue_sync(s, "a", {"x": float("nan")}), PayloadError, None),
        (lambda s: dispatcher.enqueue_sync(s, "a", {"x": object()}), PayloadError, None),
        (
            lambda s: dispatcher.enqueue_many_sync(s, [JobSpec("a"), JobSpec("a", priority=10**6)]),
            EnqueueError,
            "priority",
        ),
        (
            lambda s: dispatcher.enqueue_payloads_sync(s, "a", [{}, {"x": "\x00"}]),
            PayloadError,
            None,
        ),
    ],
)
def test_bad_input_raises_the_production_errors_and_writes_nothing(call, error, option) -> None:
    store, _, _ = make()
    with pytest.raises(error) as raised:
        call(store)
    assert getattr(raised.value, "option", None) == option
    assert store.jobs(None) == [], "a bulk call with one bad job writes none of them"


def test_a_dedupe_key_held_by_a_live_job_makes_enqueue_a_no_op() -> None:
    store, _, _ = make()
    assert dispatcher.enqueue_sync(store, "a", dedupe_key="k") == 1
    assert dispatcher.enqueue_sync(store, "a", dedupe_key="k") is None
    assert (
        dispatcher.enqueue_many_sync(
            store, [JobSpec("a", dedupe_key="j"), JobSpec("a", dedupe_key="j")]
        )
        == 1
    )


def test_run_due_runs_async_and_sync_handlers_and_what_they_enqueue() -> None:
    store, registry, runner = make()
    seen, threads = [], []

    @registry.handler("signup")
    async def signup(job):
        seen.append(("signup", job.payload["user"], job.attempts))
        await dispatcher.enqueue(store, "welcome", {"user": job.payload["user"]})

    @registry.handler("welcome")
    def welcome(job):
        threads.append(threading.current_thread() is not threading.main_thread())
        seen.append(("welcome", job.payload["user"], job.attempts))

    dispatcher.enqueue_sync(store, "signup", {"user": 7})
    dispatcher.enqueue_sync(store, "signup", {"user": 8}, delay_s=60)
    ran = runner.run_due()
    assert [(a.job_type, a.status) for a in ran] == [
        ("signup", "completed"),
        ("welcome", "completed"),
    ]
    assert seen == [("signup", 7, 1), ("welcome", 7, 1)]
    assert threads == [True], "a sync handler runs in a thread, as in a worker"
    assert_enqueued(store, "signup", {"user": 8}), "not due yet: still queued"
    runner.advance(60)
    assert [a.job_type for a in runner.run_due()] == ["signup", "welcome"]
    assert enqueued(store, status=None) == enqueued(store, status="completed")


def test_a_failing_handler_is_retried_in_the_future_of_the_clock_and_fails_after_max_attempts() -> (
    None
):
    store, registry, runner = make(retry_base_s=10.0, rand=lambda: 1.0)
    calls = []

    @registry.handler("flaky")
    def flaky(job):
        calls.append(store.clock.now())
        raise ValueError(f"down, attempt {job.attempts}")

    job_id = dispatcher.enqueue_sync(store, "flaky", max_attempts=3)
    [first] = runner.run_due()
    assert (first.status, first.kind, first.attempt) == ("queued", FailureKind.ERROR, 1)
    state = store.get(job_id)
    assert state is not None and state.run_at == T0 + timedelta(seconds=10), (
        "backoff bound 10 s x rand 1.0"
    )
    assert "ValueError: down, attempt 1" in (state.last_error or "")
    assert runner.run_due() == [], "a retry is never due at once"
    runner.advance(9.999)
    assert runner.run_due() == []
    runner.advance(0.001)
    assert [a.status for a in runner.run_due()] == ["queued"]
    ran = runner.drain()  # the third attempt, 20 s later: the clock moves there by itself
    assert [(a.attempt, a.status) for a in ran] == [(3, "failed")]
    assert calls == [T0, T0 + timedelta(seconds=10), T0 + timedelta(seconds=30)]
    failed = assert_enqueued(store, "flaky", status="failed")
    assert failed.attempts == 3 and "attempt 3" in (failed.last_error or "")


@pytest.mark.parametrize("rand", [0.0, 1e-12, 0.5])
def test_every_retry_is_due_after_the_clocks_now_even_with_a_zero_draw(rand) -> None:
    store, registry, runner = make(retry_base_s=0.001, rand=lambda: rand)
    registry.handler("fail")(_fail)
    job_id = dispatcher.enqueue_sync(store, "fail", max_attempts=5)
    for attempt in range(1, 5):
        assert [(a.attempt, a.status) for a in runner.run_due()] == [(attempt, "queued")]
        state = store.get(job_id)
        assert state is not None and state.run_at > store.clock.now()
        assert runner.run_due() == []
        runner.advance((state.run_at - store.clock.now()).total_seconds())
    assert [a.status for a in runner.run_due()] == ["failed"]


def _fail(job):
    raise RuntimeError("always")


def test_permanent_errors_unknown_types_and_timeouts_end_as_in_a_worker() -> None:
    store, registry, runner = make(job_timeout_s=0.05)

    @registry.handler("permanent")
    async def permanent(job):
        raise PermanentJobError("bad input")

    @registry.handler("stuck")
    async def stuck(job):
        await asyncio.Event().wait()

    for job_type in ("permanent", "unknown", "stuck"):
        dispatcher.enqueue_sync(store, job_type, max_attempts=1)
    ran = {a.job_type: a for a in runner.run_due()}
    assert (ran["permanent"].status, ran["permanent"].kind) == ("discarded", FailureKind.PERMANENT)
    assert (ran["unknown"].status, ran["unknown"].kind) == ("failed", FailureKind.UNKNOWN_TYPE)
    assert "no handler registered for job_type 'unknown'" in (ran["unknown"].error or "")
    assert (ran["stuck"].status, ran["stuck"].kind, ran["stuck"].error) == (
        "failed",
        FailureKind.TIMEOUT,
        "timed out after 0.05 s",
    )


def test_drain_refuses_to_run_forever() -> None:
    store, registry, runner = make()

    @registry.handler("again")
    def again(job):
        dispatcher.enqueue_sync(store, "again")

    dispatcher.enqueue_sync(store, "again")
    with pytest.raises(RuntimeError, match="enqueue jobs forever"):
        runner.drain(max_jobs=50)


def test_the_async_forms_run_inside_a_test_event_loop_and_the_sync_ones_say_so() -> None:
    store, registry, runner = make()
    registry.handler("a")(_noop)
    dispatcher.enqueue_sync(store, "a", delay_s=5)

    async def main():
        with pytest.raises(RuntimeError, match=re.escape("await runner.arun_due")):
            runner.run_due()
        assert await runner.arun_due() == []
        return [a.status for a in await runner.adrain()]

    assert asyncio.run(main()) == ["completed"]
    assert store.clock.now() == T0 + timedelta(seconds=5)


async def _noop(job):
    return None


def test_cancel_and_queues_are_honoured() -> None:
    store, registry, _ = make()
    registry.handler("a")(_noop)
    keep = dispatcher.enqueue_sync(store, "a", queue="other")
    dropped = dispatcher.enqueue_sync(store, "a")
    assert store.cancel([dropped]) == {dropped: "cancelled"}
    assert Runner(store, registry, queues=["default"]).drain() == []
    assert [a.job_id for a in Runner(store, registry).drain()] == [keep]


def test_assertions_match_payload_subsets_and_say_what_the_store_holds() -> None:
    store, _, _ = make()
    dispatcher.enqueue_sync(store, "send", {"to": "a@example.com", "template": "welcome"})
    assert assert_enqueued(store, "send", {"to": "a@example.com"}).payload["template"] == "welcome"
    assert_enqueued(store, "send", count=1)
    refute_enqueued(store, "send", {"to": "b@example.com"})
    with pytest.raises(AssertionError, match=r"found 0; the store holds:\n  #1 send queued"):
        assert_enqueued(store, "send", {"to": "b@example.com"})
    with pytest.raises(AssertionError, match=r"expected 2 queued 'send'"):
        assert_enqueued(store, "send", count=2)
    with pytest.raises(AssertionError, match=r"found \[1\]"):
        refute_enqueued(store, "send")


def test_a_payload_read_back_is_a_copy() -> None:
    store, _, _ = make()
    job_id = dispatcher.enqueue_sync(store, "a", {"list": [1]})
    state = store.get(job_id)
    assert state is not None
    state.payload["list"].append(2)
    assert store.get(job_id).payload == {"list": [1]}  # type: ignore[union-attr]


def test_the_fake_clock_moves_only_forward_and_only_when_told() -> None:
    clock = FakeClock(T0)
    assert clock.now() == T0 and clock() == 0.0
    clock.advance(1.5)
    assert clock.now() == T0 + timedelta(seconds=1.5) and clock() == 1.5
    clock.advance_to(T0)  # the past: no move
    assert clock() == 1.5
    for bad in (-1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError):
            clock.advance(bad)
    with pytest.raises(ValueError):
        FakeClock(datetime(2030, 1, 1))


def test_workers_never_load_dispatcher_testing() -> None:
    r = run_python("""
        import sys
        import dispatcher, dispatcher.serve.worker, dispatcher.cli.commands
        print("dispatcher.testing" in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_both_stores_have_the_ports_operations_with_its_signatures() -> None:
    import inspect

    from dispatcher.db.port import JobStorePort
    from dispatcher.db.store import JobStore

    operations = [
        name for name, member in vars(JobStorePort).items() if inspect.iscoroutinefunction(member)
    ]
    assert len(operations) == 10
    for store_class in (JobStore, MemoryStore):
        for name in operations:
            method = getattr(store_class, name)
            assert inspect.iscoroutinefunction(method), f"{store_class.__name__}.{name} is async"
            port = list(inspect.signature(getattr(JobStorePort, name)).parameters)
            params = inspect.signature(method).parameters
            assert list(params)[: len(port)] == port, f"{store_class.__name__}.{name}"
            # The real store's own options (a claim's flow control, a completion's chain) come
            # after, keyword-only and optional: a caller of the port never needs them.
            assert all(
                p.kind is p.KEYWORD_ONLY and p.default is not p.empty
                for p in list(params.values())[len(port) :]
            ), f"{store_class.__name__}.{name}"
    assert isinstance(MemoryStore(), JobStorePort) and isinstance(
        JobStore("postgresql:///x", "w"), JobStorePort
    )


def test_a_handler_that_raises_cancel_ends_its_job_cancelled_and_its_key_goes_on() -> None:
    store, registry, runner = make()
    ran: list[int] = []

    @registry.handler("ship")
    def ship(job) -> None:
        ran.append(job.payload["n"])
        if job.payload["n"] == 1:
            raise dispatcher.Cancel("the order was refunded")

    first = dispatcher.enqueue_sync(store, "ship", {"n": 1}, ordering_key="order-7", max_attempts=5)
    second = dispatcher.enqueue_sync(store, "ship", {"n": 2}, ordering_key="order-7")
    attempts = runner.drain()
    assert ran == [1, 2], "never retried; the key's next job ran"
    assert [(a.job_id, a.status) for a in attempts] == [(first, "cancelled"), (second, "completed")]
    assert attempts[0].kind is FailureKind.CANCELLED_BY_HANDLER
    state = store.get(first)
    assert (
        state is not None and state.last_error == "cancelled by its handler: the order was refunded"
    )
