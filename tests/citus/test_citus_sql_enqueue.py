"""dispatcher_enqueue (migration 0018, tests/integration/test_sql_enqueue.py) on a distributed
jobs table: called on the coordinator node, its rows placed by bucket, keyed and deduplicated
as on one node, and a worker in either mode is woken by it. Also when the function
is created after `migrate --citus` distributed the table (an upgrade of a cluster)."""

from __future__ import annotations

import psycopg
import pytest

from dispatcher.api.enqueue import bucket_for
from dispatcher.db.citus import distribute
from dispatcher.db.migrate import migrate
from tests.helpers import fetchall
from tests.integration.test_sql_enqueue import (  # noqa: F401
    sql_enqueue,
    test_a_dedupe_key_held_by_a_live_job_returns_null_on_both_sides,
    test_a_worker_woken_by_its_notification_runs_the_jobs_and_a_keys_jobs_in_order,
    test_an_ordering_keys_second_job_waits_whichever_side_enqueued_the_first,
    test_the_guides_trigger_enqueues_in_the_inserting_transaction_or_not_at_all,
    test_the_wake_up_is_python_enqueues_and_none_for_a_waiting_job_or_a_rollback,
)


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn


def test_created_after_the_table_was_distributed_it_enqueues_keyed_and_deduplicated_jobs(
    citus_empty_dsn: str,
) -> None:
    dsn = citus_empty_dsn
    migrate(dsn, up_to=17)
    distribute(dsn)
    assert migrate(dsn, up_to=18) == [18]
    assert distribute(dsn) == []  # nothing more to place
    migrate(dsn)  # the later migrations, which a worker's schema check asks for
    with psycopg.connect(dsn, autocommit=True) as conn:
        plain = sql_enqueue(conn, "a", partition_key="p")
        first = sql_enqueue(conn, "a", ordering_key="k", dedupe_key="d")
        behind = sql_enqueue(conn, "a", ordering_key="k")
        duplicate = sql_enqueue(conn, "a", ordering_key="k", dedupe_key="d")
    assert duplicate is None
    assert fetchall(dsn, "SELECT id, bucket, status FROM dispatcher_jobs ORDER BY id") == [
        (plain, bucket_for("p"), "queued"),
        (first, bucket_for("k"), "queued"),
        (behind, bucket_for("k"), "waiting"),
    ]
