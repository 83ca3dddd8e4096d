"""Ordering keys in the API, without a database: the bucket a key picks, the checks of enqueue,
the handler's on_ordered_failure, and what the executor tells the completer about a failure."""

from __future__ import annotations

import pytest

from dispatcher import (
    EnqueueError,
    JobSpec,
    Registry,
    enqueue_many_sync,
    enqueue_payloads_sync,
    enqueue_sync,
)
from dispatcher.api.enqueue import bucket_for
from dispatcher.model import STATUS_QUEUED, STATUS_WAITING
from dispatcher.testing import MemoryStore


def key_with_another_bucket(key: str) -> str:
    return next(k for k in (f"other-{n}" for n in range(100)) if bucket_for(k) != bucket_for(key))


def test_an_ordering_key_picks_the_bucket_and_orders_its_jobs():
    store = MemoryStore()
    ids = [enqueue_sync(store, "t", {"n": n}, ordering_key="customer:42") for n in range(3)]
    rows = [store.get(i) for i in ids]
    assert {r.bucket for r in rows if r} == {bucket_for("customer:42")}
    assert [r.status for r in rows if r] == [STATUS_QUEUED, STATUS_WAITING, STATUS_WAITING]
    assert all(r.ordering_key == "customer:42" for r in rows if r)


def test_a_partition_key_or_bucket_beside_an_ordering_key_must_agree():
    store = MemoryStore()
    assert enqueue_sync(store, "t", ordering_key="k", partition_key="k") is not None
    assert enqueue_sync(store, "t", ordering_key="k", bucket=bucket_for("k")) is not None
    with pytest.raises(EnqueueError, match="partition_key") as err:
        enqueue_sync(store, "t", ordering_key="k", partition_key=key_with_another_bucket("k"))
    assert err.value.option == "partition_key"
    with pytest.raises(EnqueueError, match="bucket"):
        enqueue_sync(store, "t", ordering_key="k", bucket=(bucket_for("k") + 1) % 64)
    with pytest.raises(EnqueueError, match="ordering_key"):
        enqueue_many_sync(store, [JobSpec("t"), JobSpec("t", ordering_key="")])
    assert len(store.jobs()) == 2, "nothing of a refused call was written"


def test_enqueue_payloads_takes_one_ordering_key_per_payload_or_none():
    store = MemoryStore()
    assert enqueue_payloads_sync(store, "t", [{}, {}, {}], ordering_keys=["a", None, "a"]) == 3
    assert [(j.ordering_key, j.status) for j in store.jobs()] == [
        ("a", STATUS_QUEUED),
        (None, STATUS_QUEUED),
        ("a", STATUS_WAITING),
    ]
    with pytest.raises(EnqueueError, match="2 ordering_keys for 3 payloads"):
        enqueue_payloads_sync(store, "t", [{}, {}, {}], ordering_keys=["a", "b"])
    with pytest.raises(EnqueueError, match="not both"):
        enqueue_payloads_sync(store, "t", [{}], ordering_keys=["a"], partition_keys=["a"])
    with pytest.raises(EnqueueError, match="job #1"):
        enqueue_payloads_sync(store, "t", [{}, {}], ordering_keys=["a", 5])
    assert len(store.jobs()) == 3


def test_on_ordered_failure_is_halt_by_default_continue_on_request_and_checked():
    registry = Registry()

    @registry.handler("halts")
    def halts(job):
        pass

    @registry.handler("goes_on", on_ordered_failure="continue")
    def goes_on(job):
        pass

    assert (registry.halts("halts"), registry.halts("goes_on"), registry.halts("unknown")) == (
        True,
        False,
        True,
    )
    with pytest.raises(ValueError, match="on_ordered_failure must be one of halt, continue"):
        registry.handler("bad", on_ordered_failure="skip")
