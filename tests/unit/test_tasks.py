"""Typed tasks (`@registry.task`): arguments bound and checked before anything is written, stored
by name, and given back to the function on the worker's side. No PostgreSQL: the in-memory store
takes the same enqueue calls (the real one: tests/integration/test_typed_tasks.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any, Literal, TypedDict

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher import (
    EnqueueError,
    JobSpec,
    PayloadError,
    Registry,
    ScheduleError,
    Task,
    enqueue_sync,
)
from dispatcher.api.task_args import accepted, foreign_class
from dispatcher.model import Job
from dispatcher.testing import MemoryStore, Runner


class Address(TypedDict):
    street: str
    city: str


registry = Registry()
calls: list[tuple[Any, ...]] = []


@registry.task(queue="emails", priority=2, max_attempts=5, timeout_s=30)
async def send_email(to: str, subject: str, cc: list[str] | None = None) -> str:
    calls.append(("send_email", to, subject, cc))
    return f"sent to {to}"


@registry.task("resize-image")
def resize(url: str, width: int = 800, *, ratio: float = 1.0, **extra: bool) -> int:
    calls.append(("resize", url, width, ratio, extra))
    return width


@registry.task()
def free_form(anything, note: Any = None, shipping: Address | None = None) -> None:
    calls.append(("free_form", anything, note, shipping))


def job(payload: Any, job_type: str = "send_email") -> Job:
    return Job(1, job_type, payload, 1, None, None, 0, 0, None, "token")


@pytest.fixture(autouse=True)
def _clear() -> None:
    calls.clear()


# -- registration ---------------------------------------------------------------------------------


def test_a_task_is_registered_under_its_name_with_the_handlers_options() -> None:
    assert isinstance(send_email, Task) and send_email.job_type == "send_email"
    assert resize.job_type == "resize-image"
    handler = registry.get("send_email")
    assert handler is not None and handler.is_async and handler.timeout_s == 30
    assert handler.fn is send_email.fn and registry.retry_of("send_email").max_attempts == 5
    sync = registry.get("resize-image")
    assert sync is not None and not sync.is_async
    assert send_email.options == {"queue": "emails", "priority": 2}
    assert send_email.__name__ == "send_email" and send_email.__doc__ == send_email.fn.__doc__


def test_calling_a_task_calls_its_function_and_enqueues_nothing() -> None:
    assert resize("u", 10) == 10
    assert asyncio.run(send_email("a@example.com", "Hi")) == "sent to a@example.com"
    assert calls == [("resize", "u", 10, 1.0, {}), ("send_email", "a@example.com", "Hi", None)]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def t(a, /, b): ...", "parameter 'a' cannot be given by name"),
        ("def t(*items): ...", "parameter 'items' cannot be given by name"),
        ("def t(when: dt.datetime): ...", "parameter 'when' is annotated datetime"),
        ("def t(p: tuple[int, int]): ...", "parameter 'p' is annotated tuple"),
        ("def t(a: Point | None = None): ...", "parameter 'a' is annotated Point"),
    ],
)
def test_a_signature_a_job_cannot_carry_is_refused_at_decoration(source: str, message: str) -> None:
    @dataclasses.dataclass
    class Point:
        x: int

    namespace: dict[str, Any] = {"dt": dt, "Point": Point}
    exec(source, namespace)
    with pytest.raises(TypeError, match=message):
        Registry().task()(namespace["t"])


def test_decoration_checks_the_options_and_that_a_schedule_can_call_it() -> None:
    r = Registry()

    def ok() -> None: ...

    with pytest.raises(EnqueueError, match="queue must match"):
        r.task(queue="no spaces")(ok)
    with pytest.raises(EnqueueError, match="job_type must match"):
        r.task()(lambda: None)  # '<lambda>' is no job type
    with pytest.raises(EnqueueError, match="priority"):
        r.task(priority=10**6)
    with pytest.raises(ValueError, match="timeout_s"):
        r.task(timeout_s=0)
    with pytest.raises(ScheduleError, match="'to' has no default"):

        @r.task(schedule="@hourly")
        def needs(to: str) -> None: ...

    @r.task(queue="reports", priority=-1, schedule="@daily")
    def nightly(full: bool = True) -> None: ...

    [schedule] = r.schedules()
    assert (schedule.job_type, schedule.queue, schedule.priority) == ("nightly", "reports", -1)
    with pytest.raises(ValueError, match="already has a handler"):
        r.task("nightly")(ok)


def test_a_forward_reference_resolves_at_the_first_enqueue() -> None:
    r = Registry()
    namespace: dict[str, Any] = {}
    exec(
        "from __future__ import annotations\ndef later(x: Later) -> None: ...\n",
        namespace,
    )
    task = r.task()(namespace["later"])  # `Later` is not defined yet: nothing checked so far
    namespace["Later"] = int
    with pytest.raises(EnqueueError, match="argument 'x' must be int, got str"):
        task.payload("seven")
    assert task.payload(7) == {"x": 7}


# -- arguments: bound, checked, stored -----------------------------------------------------------


def test_the_payload_is_the_arguments_given_by_name_without_defaults() -> None:
    assert send_email.payload("a@example.com", "Hi") == {"to": "a@example.com", "subject": "Hi"}
    assert send_email.payload(subject="Hi", to="b", cc=["c"]) == {
        "to": "b",
        "subject": "Hi",
        "cc": ["c"],
    }
    # **extra is stored flat: the function's own call binds it again
    assert resize.payload("u", ratio=2, retina=True) == {"url": "u", "ratio": 2, "retina": True}


@pytest.mark.parametrize(
    ("call", "option", "message"),
    [
        (lambda s: send_email.enqueue_sync(s, "a"), "subject", "missing argument 'subject'"),
        (lambda s: send_email.enqueue_sync(s, "a", "b", bcc="c"), "bcc", "unknown argument 'bcc'"),
        (lambda s: send_email.enqueue_sync(s, "a", "b", to="c"), "to", "'to' given twice"),
        (lambda s: resize.enqueue_sync(s, "u", 1, 2.0), None, "takes 2 positional arguments"),
        (lambda s: send_email.enqueue_sync(s, 42, "b"), "to", "'to' must be str, got int"),
        (lambda s: send_email.enqueue_sync(s, "a", "b", cc="c"), "cc", "list | None, got str"),
        (lambda s: resize.enqueue_sync(s, "u", width=1.5), "width", "must be int, got float"),
        (lambda s: resize.enqueue_sync(s, "u", retina="yes"), "retina", "must be bool, got str"),
        (lambda s: free_form.enqueue_sync(s, 1, shipping=[]), "shipping", "dict | None, got list"),
        (lambda s: free_form.enqueue_sync(s, object()), "anything", "cannot be stored as JSON"),
        (lambda s: free_form.enqueue_sync(s, 1, {"x": float("nan")}), "note", "holds nan"),
        (lambda s: free_form.enqueue_sync(s, "\x00"), "anything", "NUL"),
        (lambda s: asyncio.run(send_email.enqueue(s, "a")), "subject", "missing argument"),
        (lambda s: send_email.spec(1, "b"), "to", "must be str"),
        (
            lambda s: send_email.with_options(queue="bad queue").enqueue_sync(s, "a", "b"),
            "queue",
            "queue must match",
        ),
    ],
)
def test_bad_arguments_raise_enqueue_error_naming_them_and_write_nothing(
    call: Any, option: str | None, message: str
) -> None:
    store = MemoryStore()
    with pytest.raises(EnqueueError, match=message) as raised:
        call(store)
    assert raised.value.option == option
    assert store.jobs() == []


def test_a_payload_over_the_size_limit_is_still_a_payload_error() -> None:
    store = MemoryStore()
    with pytest.raises(PayloadError, match="over the limit"):
        free_form.enqueue_sync(store, "x" * (2 << 20))
    assert store.jobs() == []


def test_values_are_checked_as_isinstance_would_and_as_a_type_checker_accepts_them() -> None:
    assert resize.payload("u", ratio=2) == {"url": "u", "ratio": 2}  # an int is a float
    assert resize.payload("u", width=True) == {"url": "u", "width": True}  # a bool is an int
    assert free_form.payload((1, 2), note={1, 2} and "unchecked") == {
        "anything": (1, 2),
        "note": "unchecked",
    }
    shipping: Address = {"street": "Main St", "city": "Springfield"}
    assert free_form.payload(None, shipping=shipping)["shipping"] == shipping


@pytest.mark.parametrize(
    ("annotation", "classes"),
    [
        (str, (str,)),
        (float, (float, int)),
        (list[int], (list,)),
        (dict[str, Any], (dict,)),
        (str | None, (str, type(None))),
        (int | list[str] | None, (int, list, type(None))),
        (Address, (dict,)),
        (None, (type(None),)),
        (Any, None),
        (object, None),
        (Literal["a", "b"], None),
        (str | Any, None),
    ],
)
def test_which_annotations_are_checked_at_run_time(annotation: Any, classes: Any) -> None:
    assert accepted(annotation) == classes


def test_json_classes_and_their_bases_are_at_home_in_a_payload() -> None:
    from collections.abc import Mapping, Sequence

    for fits in (str, int, float, bool, list, dict, object, Sequence[int], Mapping[str, int]):
        assert foreign_class(fits) is None
    assert foreign_class(Address | None) is None
    assert foreign_class(dt.date | None) is dt.date
    assert foreign_class(set[str]) is set


# -- options ------------------------------------------------------------------------------------


def test_with_options_sets_job_options_over_the_decorators_and_leaves_the_task_as_it_was() -> None:
    store = MemoryStore()
    later = send_email.with_options(priority=7, delay_s=30, dedupe_key="welcome:a")
    assert later.with_options(queue="bulk").options == {
        "queue": "bulk",
        "priority": 7,
        "delay_s": 30,
        "dedupe_key": "welcome:a",
    }
    assert send_email.options == {"queue": "emails", "priority": 2}
    first = later.enqueue_sync(store, "a", "Hi")
    assert later.enqueue_sync(store, "a", "Hi") is None  # the dedupe key is held
    row = store.get(first or 0)
    assert row is not None
    assert (row.queue, row.priority, row.dedupe_key, row.job_type) == (
        "emails",
        7,
        "welcome:a",
        "send_email",
    )
    assert row.run_at == store.clock.now() + dt.timedelta(seconds=30)
    with pytest.raises(TypeError, match="unknown job options 'queu'"):
        send_email.with_options(queu="x")  # type: ignore[call-arg]


def test_spec_is_a_job_spec_with_the_tasks_options() -> None:
    spec = send_email.with_options(ordering_key="user:1").spec("a", "Hi")
    assert spec == JobSpec(
        "send_email",
        {"to": "a", "subject": "Hi"},
        queue="emails",
        priority=2,
        ordering_key="user:1",
    )


# -- the worker's side ----------------------------------------------------------------------------


def test_the_handler_calls_the_function_with_the_payloads_keys() -> None:
    handler = registry.get("resize-image")
    assert handler is not None
    assert handler.run(job({"url": "u", "ratio": 0.5, "retina": True}, "resize-image")) == 800
    assert calls == [("resize", "u", 800, 0.5, {"retina": True})]
    coroutine = registry.get("send_email").run(job({"to": "a", "subject": "b"}))  # type: ignore[union-attr]
    assert asyncio.run(coroutine) == "sent to a"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"to": "a"}, "missing 1 required positional argument: 'subject'"),
        ({"to": "a", "subject": "b", "bcc": "c"}, "unexpected keyword argument 'bcc'"),
        ([1, 2], "takes its arguments as a JSON object, got a payload of type list"),
    ],
)
def test_a_payload_that_does_not_fit_fails_its_attempt_to_be_retried(
    payload: Any, message: str
) -> None:
    """A job enqueued by another version of the app: a TypeError, retried as any error, so that
    a worker of that version can run it during a rolling deploy."""
    store = MemoryStore()
    enqueue_sync(store, "send_email", payload, queue="emails")
    [attempt] = Runner(store, registry).run_due()
    assert attempt.status == "queued" and message in (attempt.error or "")


def test_a_job_enqueued_with_arguments_runs_its_function_with_them() -> None:
    store = MemoryStore()
    send_email.enqueue_sync(store, "ada@example.com", "Welcome", cc=["team@example.com"])
    asyncio.run(resize.with_options(queue="images").enqueue(store, "img.png", ratio=0.5))
    attempts = Runner(store, registry).drain()
    assert [a.status for a in attempts] == ["completed", "completed"]
    assert sorted(calls, key=str) == [
        ("resize", "img.png", 800, 0.5, {}),
        ("send_email", "ada@example.com", "Welcome", ["team@example.com"]),
    ]


# -- property: what the function receives is what it was given -----------------------------------

# JSON text: no surrogate halves (not UTF-8), no NUL (jsonb refuses it)
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # orjson's range
    | text
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
received: list[dict[str, Any]] = []
echo_registry = Registry()


@echo_registry.task()
def echo(a: Any, b: Any = "default", *, c: Any = None, **rest: Any) -> None:
    received.append({"a": a, "b": b, "c": c, **rest})


@given(
    a=json_values,
    b=st.none() | json_values,
    rest=st.dictionaries(
        text.filter(lambda k: k not in ("", "a", "b", "c")), json_values, max_size=3
    ),
)
def test_the_function_receives_the_arguments_it_was_enqueued_with(
    a: Any, b: Any, rest: dict[str, Any]
) -> None:
    received.clear()
    stored = orjson.loads(orjson.dumps(echo.payload(a, b, **rest)))  # as a worker reads it
    echo.handle(job(stored, "echo"))
    assert received == [{"a": a, "b": b, "c": None, **rest}]
    payload = echo.payload(a, **rest)
    assert "b" not in payload and "c" not in payload  # defaults are the function's, not stored
