"""Which bucket a job lands in, and why the unique indexes that include the bucket (migration
0014) keep their meaning: every key that a unique index is about places its job, so two jobs of
one (queue, key) share a bucket whenever nothing else placed them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dispatcher import JobSpec, enqueue_many_sync, enqueue_sync
from dispatcher.api.enqueue import bucket_for
from dispatcher.testing import MemoryStore

keys = st.text(min_size=1, max_size=40).filter(lambda k: "\x00" not in k)


def _bucket(**options: object) -> int:
    store = MemoryStore()
    job_id = enqueue_sync(store, "t", {}, **options)  # type: ignore[arg-type]
    assert job_id is not None
    row = store.get(job_id)
    assert row is not None
    return row.bucket


@given(keys)
def test_a_dedupe_key_alone_places_its_job_in_its_own_bucket(key):
    assert _bucket(dedupe_key=key) == _bucket(dedupe_key=key) == bucket_for(key)


@given(keys, keys)
def test_an_ordering_key_then_a_partition_key_place_a_job_before_its_dedupe_key(key, dedupe):
    assert _bucket(ordering_key=key, dedupe_key=dedupe) == bucket_for(key)
    assert _bucket(partition_key=key, dedupe_key=dedupe) == bucket_for(key)
    assert _bucket(bucket=5, dedupe_key=dedupe) == 5


def test_jobs_without_keys_spread_over_the_buckets():
    store = MemoryStore()
    enqueue_many_sync(store, [JobSpec("t", {}) for _ in range(2000)])
    assert len({r.bucket for r in store.jobs()}) > 48


def test_a_dedupe_key_still_dedupes_across_enqueues():
    store = MemoryStore()
    first = enqueue_sync(store, "t", {}, dedupe_key="order-8812")
    assert first is not None
    assert enqueue_sync(store, "t", {}, dedupe_key="order-8812") is None
