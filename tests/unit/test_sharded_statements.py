"""The per-bucket statements of a distributed jobs table, without a cluster: how writes are
grouped by bucket, which bucket a failure names (the store reads the others' from the table),
and the texts pinned to one bucket (the cluster tests run them under EXPLAIN: tests/citus)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.db.completions import completion_statements
from dispatcher.db.queries import query
from dispatcher.db.rows import Failure, TypeFilter
from dispatcher.db.sharded import (
    ShardedStatements,
    by_bucket,
    claim_text,
    failure_bucket,
    pinned,
)
from dispatcher.db.store import JobStore
from dispatcher.model import Outcome


@given(st.lists(st.integers(0, 63), max_size=200))
def test_grouping_by_bucket_keeps_every_item_once_in_order(buckets):
    groups = by_bucket(buckets)
    assert sorted(i for at in groups.values() for i in at) == list(range(len(buckets)))
    for bucket, at in groups.items():
        assert at == sorted(at) and all(buckets[i] == bucket for i in at)


def test_a_failure_names_its_bucket_or_its_jobs_or_none_and_the_store_reads_it():
    outcome = Outcome("failed", 0.0, "e")
    assert failure_bucket(Failure(1, "t", outcome, bucket=9)) == 9
    assert failure_bucket(Failure(1, "t", outcome)) is None


@pytest.mark.parametrize(
    "text",
    [
        completion_statements("keep")[False],
        query("jobs_fail_owned"),
        query("jobs_release_owned"),
        query("jobs_extend_leases"),
    ],
)
def test_every_write_by_ids_is_pinned_to_one_bucket(text):
    one = pinned(text)
    assert "j.bucket = %(bucket)s::smallint AND j.id = ANY(%(ids)s::bigint[])" in one
    assert "WHERE j.id = ANY(%(ids)s::bigint[])" not in one


def test_a_text_that_does_not_select_by_ids_is_not_pinned():
    with pytest.raises(ValueError, match="select its rows"):
        pinned("UPDATE dispatcher_jobs SET x = 1")


def test_the_claim_locks_rows_only_in_skip_locked_mode_and_filters_types():
    assert "FOR UPDATE SKIP LOCKED" in claim_text(None, skip_locked=True)
    assert "FOR UPDATE" not in claim_text(None, skip_locked=False)
    assert "job_type = ANY" in claim_text(TypeFilter(("a",), True), skip_locked=False)
    assert "job_type <> ALL" in claim_text(TypeFilter(("a",), False), skip_locked=False)
    assert "{" not in claim_text(None, skip_locked=False).replace("'{", "")


class _Cursor:
    def __init__(self, rows):
        self._rows = rows

    async def fetchall(self):
        return self._rows


def _claims_visiting(queued: dict[int, int]):
    """A ShardedStatements whose claim statement finds queued[bucket] jobs (none claimed: others
    took them), and the list of buckets each statement named."""
    visited: list[int] = []

    async def execute(what, sql, params):
        visited.append(params["bucket"])
        found = queued.get(params["bucket"], 0)
        return _Cursor([(None,) * 9 + (found, None, None, None)])

    return ShardedStatements(execute, "w", query("jobs_complete_owned"), "c"), visited


def test_a_bucket_found_empty_is_skipped_until_it_is_said_to_have_work():
    statements, visited = _claims_visiting({3: 5})
    run = asyncio.run
    run(statements.claim("q", 10, 30.0, [1, 2, 3], None, None))
    assert sorted(visited) == [1, 2, 3]
    visited.clear()
    run(statements.claim("q", 10, 30.0, [1, 2, 3], None, None))
    assert visited == [3]  # 1 and 2 were dry; 3 had jobs
    statements.ready("q", 2)
    visited.clear()
    run(statements.claim("q", 10, 30.0, [1, 2, 3], None, None))
    assert sorted(visited) == [2, 3]
    statements.ready(None, None)
    visited.clear()
    run(statements.claim("q", 10, 30.0, [1, 2, 3], None, None))
    assert sorted(visited) == [1, 2, 3]


def test_a_bucket_dry_for_one_claims_types_is_still_visited_for_another_types():
    statements, visited = _claims_visiting({})
    run = asyncio.run
    others = TypeFilter(("sms",), False)
    run(statements.claim("q", 10, 30.0, [1, 2], others, None))
    visited.clear()
    run(statements.claim("q", 10, 30.0, [1, 2], TypeFilter(("sms",), True), None))
    assert sorted(visited) == [1, 2]


def test_on_a_cluster_a_claim_window_reads_its_own_buckets_and_no_veto():
    """A cluster claims bucket by bucket: the store takes a window's `outside` and leaves it
    unread, so priority holds within a bucket there (docs/concepts/citus.md)."""
    statements, visited = _claims_visiting({1: 1})
    store = JobStore("postgresql://unused", "w")

    async def placement() -> ShardedStatements:
        return statements

    store._placement = placement  # type: ignore[method-assign]
    claimed = asyncio.run(store.jobs_claim("q", 10, 30.0, [1, 2], outside=[3, 4]))
    assert sorted(visited) == [1, 2]
    assert (claimed.selected, claimed.outranked) == (1, False)
