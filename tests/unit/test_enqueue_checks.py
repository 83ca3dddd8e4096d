"""What enqueue accepts, without a server: the rules themselves. tests/integration/test_enqueue.py
proves that every enqueue path applies them and writes nothing when one refuses."""

import dataclasses
import datetime as dt
import enum

import pytest

from dispatcher import JobSpec, enqueue_many_sync, enqueue_sync
from dispatcher.api.enqueue_checks import (
    MAX_DEDUPE_WINDOW_S,
    MAX_DELAY_S,
    check_dedupe_window,
    check_keys,
    check_names,
    check_options,
    holds_nul,
    non_finite_float,
    serialize_payload,
)
from dispatcher.errors import EnqueueError, PayloadError
from dispatcher.testing import MemoryStore

NAN, INF = float("nan"), float("inf")


class Level(enum.Enum):
    HIGH = INF


@dataclasses.dataclass
class Reading:
    value: object


@pytest.mark.parametrize(
    "payload",
    [
        NAN,
        INF,
        -INF,
        {"ratio": NAN},
        {"a": None, "b": [1, 2, {"c": -INF}]},  # the None makes the JSON hold a null either way
        [None, (1.5, INF)],
        {"level": Level.HIGH},
        Reading(NAN),
        {"readings": [Reading([0.5, NAN])]},
        type("Sub", (dict,), {})(x=NAN),  # a dict subclass: orjson writes it like a dict
    ],
)
def test_nan_and_infinity_anywhere_in_a_payload_are_refused(payload):
    with pytest.raises(PayloadError, match="NaN or Infinity"):
        serialize_payload(payload, 1 << 20)


@pytest.mark.parametrize(
    "payload, expected",
    [
        ({"a": None, "b": 1.5, "c": "null"}, b'{"a":null,"b":1.5,"c":"null"}'),
        ([None, [None, [1e308, -0.0]]], b"[null,[null,[1e+308,-0.0]]]"),
        (Reading([1.0, None]), b'{"value":[1.0,null]}'),
        ({"s": "a literal \\u0000, not a NUL"}, b'{"s":"a literal \\\\u0000, not a NUL"}'),
        (None, b"{}"),
    ],
)
def test_payloads_with_null_or_escapes_that_store_as_given_pass(payload, expected):
    assert serialize_payload(payload, 1 << 20) == expected


@pytest.mark.parametrize("payload", [{"s": "a\x00b"}, {"key\x00": 1}, ["x", ("y\x00",)]])
def test_a_nul_character_is_refused_before_the_database_would_fail_the_whole_batch(payload):
    with pytest.raises(PayloadError, match="NUL"):
        serialize_payload(payload, 1 << 20)


def test_the_walks_find_only_what_is_there():
    assert non_finite_float({"a": [1, 2.5, None, "nan", {"b": True}]}) is None
    assert non_finite_float({"a": [1, {"b": (None, -INF)}]}) == -INF
    assert holds_nul({"a": ["x", {"y": "z"}]}) is False


def test_the_size_limit_counts_json_bytes():
    payload = {"customer": "c-4242", "plan": "pro-annual-42"}  # 44 bytes of JSON
    assert len(serialize_payload(payload, 44)) == 44
    with pytest.raises(PayloadError, match="44 bytes, over the limit of 43 bytes"):
        serialize_payload(payload, 43)


GOOD = {"priority": 0, "max_attempts": 20, "delay_s": 0.0, "jitter_s": 0.0, "run_at": None}


@pytest.mark.parametrize(
    "option, value",
    [
        ("max_attempts", 1.5),
        ("max_attempts", 2.0),
        ("max_attempts", True),
        ("max_attempts", "3"),
        ("max_attempts", 0),
        ("priority", 1.5),
        ("priority", False),
        ("priority", 40_000),
        ("delay_s", NAN),
        ("delay_s", INF),
        ("delay_s", -INF),
        ("delay_s", -1),
        ("delay_s", MAX_DELAY_S * 2),
        ("delay_s", "5"),
        ("delay_s", True),
        ("jitter_s", NAN),
        ("jitter_s", INF),
        ("jitter_s", -0.5),
        ("jitter_s", None),
        ("run_at", "2030-01-01"),
        ("run_at", dt.datetime(2030, 1, 1)),
    ],
)
def test_bad_options_raise_enqueue_error_naming_the_option(option, value):
    with pytest.raises(EnqueueError) as info:
        check_options(**{**GOOD, option: value})
    assert info.value.option == option
    assert option in str(info.value)


def test_good_options_pass():
    check_options(priority=-32768, max_attempts=1, delay_s=MAX_DELAY_S, jitter_s=0, run_at=None)
    check_options(
        priority=32767,
        max_attempts=1_000_000,
        delay_s=0,
        jitter_s=2.5,
        run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
    )


@pytest.mark.parametrize(
    "bucket, partition_key, dedupe_key, option",
    [
        (64, None, None, "bucket"),
        (1.5, None, None, "bucket"),
        (True, None, None, "bucket"),
        (3, "customer-1", None, "bucket"),
        (None, 42, None, "partition_key"),
        (None, None, 7, "dedupe_key"),
    ],
)
def test_bad_keys_name_the_option(bucket, partition_key, dedupe_key, option):
    with pytest.raises(EnqueueError) as info:
        check_keys(bucket, partition_key, dedupe_key)
    assert info.value.option == option


@pytest.mark.parametrize(
    "queue, job_type, option",
    [
        ("q\n", "a", "queue"),  # `$` matched before a trailing newline; COPY rows would break
        ("we ird", "a", "queue"),
        ("default", ["a"], "job_type"),
        ("default", "a\tb", "job_type"),
    ],
)
def test_bad_names_are_refused(queue, job_type, option):
    with pytest.raises(EnqueueError) as info:
        check_names(queue, job_type)
    assert info.value.option == option


@pytest.mark.parametrize("key", ["", "x" * 501, "a\x00b", 7, b"k"])
def test_a_bad_ordering_key_is_refused_before_anything_is_sent(key):
    from dispatcher.api.enqueue_checks import check_ordering_key
    from dispatcher.errors import EnqueueError

    with pytest.raises(EnqueueError, match="ordering_key") as err:
        check_ordering_key(key)
    assert err.value.option == "ordering_key"


@pytest.mark.parametrize(
    "window_s, dedupe_key, says",
    [
        (60.0, None, "needs a dedupe_key"),
        (0, "k", "> 0"),
        (-1.0, "k", "> 0"),
        (float("nan"), "k", "> 0"),
        (float("inf"), "k", "> 0"),
        (True, "k", "> 0"),
        ("60", "k", "> 0"),
        (MAX_DEDUPE_WINDOW_S + 1, "k", "at most"),
    ],
)
def test_a_bad_dedupe_window_names_the_option(window_s, dedupe_key, says):
    with pytest.raises(EnqueueError, match=says) as caught:
        check_dedupe_window(window_s, dedupe_key)
    assert caught.value.option == "dedupe_window_s"


@pytest.mark.parametrize("window_s", [None, 0.001, 1, 3600.0, MAX_DEDUPE_WINDOW_S])
def test_a_good_dedupe_window_passes(window_s):
    check_dedupe_window(window_s, "k")


def test_a_bad_dedupe_window_is_refused_before_anything_is_sent():
    class Unreachable:  # a connection that fails the test if enqueue sends anything
        def __getattr__(self, name):
            raise AssertionError(f"enqueue used the connection ({name}) for a bad window")

    with pytest.raises(EnqueueError) as caught:
        enqueue_sync(Unreachable(), "send", dedupe_key="k", dedupe_window_s=-5)  # type: ignore[arg-type]
    assert caught.value.option == "dedupe_window_s"
    store = MemoryStore()  # bulk: the batch is judged whole before its first row is stored
    with pytest.raises(EnqueueError) as caught:
        enqueue_many_sync(
            store,
            [
                JobSpec("send", dedupe_key="k", dedupe_window_s=1),
                JobSpec("send", dedupe_window_s=1),
            ],
        )
    assert caught.value.option == "dedupe_window_s" and "job #1" in str(caught.value)
    assert store.jobs() == []


@pytest.mark.parametrize(
    "key, says",
    [
        ("", "an empty string"),
        ("k" * 501, "501 characters"),
        ("a\x00b", "with a NUL"),
        (7, "must be a string"),
    ],
)
def test_a_bad_dedupe_key_is_refused_like_an_ordering_key(key, says):
    with pytest.raises(EnqueueError, match=says) as caught:
        check_keys(None, None, key)
    assert caught.value.option == "dedupe_key"


@pytest.mark.parametrize("key", ["k", "k" * 500, "ключ-ü-🙂" * 50])
def test_a_dedupe_key_up_to_the_bound_passes(key):
    check_keys(None, None, key)


@pytest.mark.parametrize("key", ["", "k" * 3000, "a\x00b"])
def test_a_bad_dedupe_key_in_bulk_names_the_jobs_index_and_nothing_is_stored(key):
    store = MemoryStore()
    specs = [JobSpec("send", dedupe_key="fine"), JobSpec("send"), JobSpec("send", dedupe_key=key)]
    with pytest.raises(EnqueueError) as caught:
        enqueue_many_sync(store, specs)
    assert caught.value.option == "dedupe_key"
    assert str(caught.value).startswith("job #2 ('send'): dedupe_key must be 1 to 500 characters")
    assert store.jobs() == []
