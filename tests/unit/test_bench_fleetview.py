"""The fleet bench's reading of a worker's mode from its claim statement (bench/fleetview.py), on
the texts PostgreSQL would show: the real claim statements, with psycopg's $n placeholders, whole
or cut short by track_activity_query_size."""

from __future__ import annotations

import pytest

from bench.fleetview import PARTITIONED, SKIP_LOCKED, FleetSampler, claim_mode, server_text
from dispatcher.db.store import claim_sql, steal_sql

CLAIMS = {
    "skip_locked": (claim_sql(None), SKIP_LOCKED),
    "partitioned, some buckets": (claim_sql([0, 5, 9]), PARTITIONED),
    "partitioned, every bucket (a single worker)": (claim_sql(range(64)), PARTITIONED),
    "partitioned, stealing": (steal_sql(), PARTITIONED),
    "partitioned, a claim window": (claim_sql([0, 32], window=True), PARTITIONED),
}


def test_server_text_numbers_placeholders_in_order_of_first_use() -> None:
    assert (
        server_text("a = %(x)s AND b = %(y)s OR c = %(x)s LIKE 'p%%'")
        == "a = $1 AND b = $2 OR c = $1 LIKE 'p%'"
    )


@pytest.mark.parametrize("name", CLAIMS)
def test_each_claim_statement_tells_its_mode(name: str) -> None:
    sql, mode = CLAIMS[name]
    text = server_text(sql)
    assert claim_mode(text) == mode
    assert claim_mode(text[:1023]) == mode, "cut at the default track_activity_query_size (1 kB)"


def test_texts_that_cannot_tell_give_no_mode() -> None:
    skip_locked = server_text(claim_sql(None))
    assert claim_mode(skip_locked[:200]) is None, "cut before the two modes' statements differ"
    assert claim_mode("<insufficient privilege>") is None  # another role's session
    assert claim_mode(None) is None and claim_mode("") is None
    assert claim_mode("SELECT 1") is None


def test_sampler_counts_processes_per_mode_and_says_mixed_during_a_switch() -> None:
    sampler = FleetSampler()
    sampler.sessions = {1, 2, 3}
    sampler.mode_of = {1: PARTITIONED, 2: SKIP_LOCKED}
    assert sampler.modes() == {PARTITIONED: 1, SKIP_LOCKED: 1, "unknown": 1}
    assert sampler.mode() == "mixed"
    sampler.mode_of = {1: PARTITIONED, 2: PARTITIONED}
    assert sampler.mode() == PARTITIONED
    assert FleetSampler().mode() == "unknown"
