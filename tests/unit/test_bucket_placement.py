"""Which bucket a job lands in, and why the unique indexes that include the bucket (migration
0014) keep their meaning: every key that a unique index is about places its job (the first given
of ordering_key, then bucket or partition_key, then dedupe_key; random only without any), so two
jobs of one (queue, key) share a bucket whenever nothing else placed them. On PostgreSQL:
tests/integration/test_bucket_unique_keys.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import (
    EnqueueError,
    JobSpec,
    enqueue,
    enqueue_many,
    enqueue_many_sync,
    enqueue_sync,
)
from dispatcher.api.enqueue import bucket_for
from dispatcher.constants import NUM_BUCKETS
from dispatcher.testing import MemoryStore
from tests.helpers import run_async

# What a text column holds and UTF-8 encodes: no NUL, no lone surrogate.
keys = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1)


def bucket_of(store: MemoryStore, job_id: int | None) -> int:
    assert job_id is not None
    row = store.get(job_id)
    assert row is not None
    return row.bucket


def key_in_another_bucket(*taken: str) -> str:
    buckets = {bucket_for(k) for k in taken}
    return next(k for k in (f"other-{n}" for n in range(1000)) if bucket_for(k) not in buckets)


def key_in_the_bucket_of(key: str) -> str:
    return next(k for k in (f"same-{n}" for n in range(10_000)) if bucket_for(k) == bucket_for(key))


@settings(max_examples=200, deadline=None)
@given(keys)
def test_a_dedupe_key_alone_puts_its_job_in_the_same_bucket_on_every_path(key: str) -> None:
    store = MemoryStore()
    placed = [
        bucket_of(store, enqueue_sync(store, "t", dedupe_key=key, queue="single")),
        bucket_of(store, run_async(enqueue(store, "t", dedupe_key=key, queue="async"))),
    ]
    assert enqueue_many_sync(store, [JobSpec("t", dedupe_key=key, queue="bulk")]) == 1
    assert run_async(enqueue_many(store, [JobSpec("t", dedupe_key=key, queue="bulk_async")])) == 1
    assert (
        enqueue_sync(store, "t", dedupe_key=key, dedupe_window_s=60.0, queue="window") is not None
    )
    placed += [j.bucket for j in store.jobs() if j.queue not in ("single", "async")]
    assert placed == [bucket_for(key)] * 5


@settings(max_examples=300, deadline=None)
@given(
    ordering_key=st.none() | keys,
    placement=st.none()
    | st.tuples(st.just("bucket"), st.integers(0, NUM_BUCKETS - 1))
    | st.tuples(st.just("partition_key"), keys),
    dedupe_key=st.none() | keys,
)
def test_the_first_key_given_picks_the_bucket(
    ordering_key: str | None,
    placement: tuple[str, int | str] | None,
    dedupe_key: str | None,
) -> None:
    """ordering_key, then bucket or partition_key, then dedupe_key; a bucket or partition key
    beside an ordering key must name its bucket."""
    options = {} if placement is None else {placement[0]: placement[1]}
    placed_by = None
    if placement is not None:
        value = placement[1]
        placed_by = value if isinstance(value, int) else bucket_for(value)
    store = MemoryStore()
    if ordering_key is not None and placed_by not in (None, bucket_for(ordering_key)):
        with pytest.raises(EnqueueError):
            enqueue_sync(store, "t", ordering_key=ordering_key, dedupe_key=dedupe_key, **options)
        assert store.jobs() == []
        return
    job_id = enqueue_sync(store, "t", ordering_key=ordering_key, dedupe_key=dedupe_key, **options)
    expected = (
        bucket_for(ordering_key)
        if ordering_key is not None
        else placed_by
        if placed_by is not None
        else bucket_for(dedupe_key)
        if dedupe_key is not None
        else None
    )
    if expected is None:
        assert 0 <= bucket_of(store, job_id) < NUM_BUCKETS
    else:
        assert bucket_of(store, job_id) == expected


def test_a_dedupe_key_that_places_its_job_is_unique_in_its_queue() -> None:
    store = MemoryStore()
    first = enqueue_sync(store, "t", dedupe_key="report:42")
    assert enqueue_sync(store, "t", dedupe_key="report:42") is None
    assert enqueue_many_sync(store, [JobSpec("t", dedupe_key="report:42")] * 3) == 0
    # placed in the same bucket by another key: the same live job holds it
    same_bucket = key_in_the_bucket_of("report:42")
    assert enqueue_sync(store, "t", dedupe_key="report:42", partition_key=same_bucket) is None
    assert [j.id for j in store.jobs()] == [first]


def test_beside_a_partition_key_a_dedupe_key_is_still_unique_in_its_queue() -> None:
    """On one node the queue-wide dedupe index stays (migration 0014), and the in-memory store
    keeps its rule: whatever placed the jobs, one live job per (queue, dedupe_key)."""
    store = MemoryStore()
    a = key_in_another_bucket("report:42")
    b = key_in_another_bucket("report:42", a)
    assert enqueue_sync(store, "t", dedupe_key="report:42", partition_key=a) is not None
    assert enqueue_sync(store, "t", dedupe_key="report:42", partition_key=a) is None
    assert enqueue_sync(store, "t", dedupe_key="report:42", partition_key=b) is None
    assert enqueue_sync(store, "t", dedupe_key="report:42") is None
    assert [j.bucket for j in store.jobs()] == [bucket_for(a)]


def test_a_keyed_batch_job_whose_dedupe_key_is_live_elsewhere_leaves_its_key_to_the_next() -> None:
    store = MemoryStore()
    other = key_in_another_bucket("acct")
    assert enqueue_sync(store, "t", dedupe_key="x", partition_key=other) is not None
    specs = [
        JobSpec("t", {"n": 1}, dedupe_key="x", ordering_key="acct"),
        JobSpec("t", {"n": 2}, ordering_key="acct"),
    ]
    assert enqueue_many_sync(store, specs) == 1
    keyed = [(j.payload["n"], j.status) for j in store.jobs() if j.ordering_key == "acct"]
    assert keyed == [(2, "queued")]


def test_a_window_holds_its_key_in_the_whole_queue_whatever_placed_the_jobs() -> None:
    store = MemoryStore()
    a = key_in_another_bucket("k")
    b = key_in_another_bucket("k", a)
    assert enqueue_sync(store, "t", dedupe_key="k", dedupe_window_s=60, partition_key=a)
    assert enqueue_sync(store, "t", dedupe_key="k", dedupe_window_s=60, partition_key=b) is None
    assert enqueue_sync(store, "t", dedupe_key="k", dedupe_window_s=60) is None
    # in one batch too: the first of the key's jobs goes in, a later one with a window does not
    spec = JobSpec("t", dedupe_key="j", dedupe_window_s=60, partition_key=a, queue="bulk")
    later = JobSpec("t", dedupe_key="j", dedupe_window_s=60, partition_key=b, queue="bulk")
    assert enqueue_many_sync(store, [spec, later]) == 1
    assert [j.bucket for j in store.jobs(queue="bulk")] == [bucket_for(a)]


def test_jobs_without_keys_spread_over_the_buckets():
    store = MemoryStore()
    enqueue_many_sync(store, [JobSpec("t", {}) for _ in range(2000)])
    assert len({r.bucket for r in store.jobs()}) > 48
