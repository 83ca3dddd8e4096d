"""The KEDA scaler's query (k8s/components/keda), read out of the rendered manifest and run as it
stands on a real migrated database: it counts the due queued jobs of the fleet's queues (any
priority) and nothing else (another queue, delayed, waiting, running, finished, a paused queue's
jobs, which no worker claims), stops at its cap,
and reads the claim index alone (an Index Only Scan of dispatcher_jobs_claim_idx).

Rendering needs kubectl: skipped, saying how to install it, where it is missing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from dispatcher import enqueue_payloads_sync, enqueue_sync
from dispatcher.admin import pause_queue, resume_queue
from tests.deploy.support import documents
from tests.deploy.test_keda import cap_of, query_of, queues_in, with_keda

FLEET = "default, emails"  # the overlay's DISPATCHER_QUEUES, spaced as a person writes it
OTHER = "reports"  # a queue of another fleet


@pytest.fixture(scope="module")
def query(tmp_path_factory: pytest.TempPathFactory) -> str:
    text = query_of(
        documents(with_keda(tmp_path_factory.mktemp("keda"), "partitioned-postgres", FLEET))
    )
    assert queues_in(text) == ("default", "emails")
    return text


def backlog(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()  # the manifest's text, no parameters, as KEDA sends it
    assert row is not None
    return int(row[0])


def add(
    conn: psycopg.Connection[Any], queue: str = "default", sql: str = "", **options: Any
) -> int:
    """One job, then put in a status by SQL as a worker would leave it."""
    job_id = enqueue_sync(conn, "report.build", {"n": 1}, queue=queue, **options)
    assert job_id is not None
    if sql:
        conn.execute(f"UPDATE dispatcher_jobs SET {sql} WHERE id = %s", (job_id,))
    return job_id


def test_it_counts_the_due_jobs_of_the_fleets_queues_only(dsn: str, query: str) -> None:
    assert backlog(dsn, query) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Counted: due and queued in the fleet's queues, whatever the priority.
        for queue, priority in (
            ("default", 0),
            ("default", -100),
            ("default", 100),
            ("emails", 0),
            ("emails", 5),
        ):
            add(conn, queue, priority=priority)
        # overdue: a retry that came due an hour ago
        add(conn, "default", "run_at = now() - interval '1 hour'")
        counted = 6
        # Not counted: another queue's due jobs ...
        add(conn, OTHER)
        add(conn, OTHER, priority=-100)
        # ... delayed jobs (a delay, a retry's backoff, a snooze: run_at in the future) ...
        add(conn, "default", delay_s=3600)
        add(conn, "emails", sql="run_at = now() + interval '5 seconds'")
        # ... a job held behind its ordering key's running holder (waiting) ...
        add(
            conn,
            "default",
            "status = 'running', attempts = 1, locked_by = 'w', "
            "lease_expires_at = now() + interval '1 hour'",
            ordering_key="customer-7",
        )
        add(conn, "default", ordering_key="customer-7")
        # ... running, and every finished status.
        add(
            conn,
            "emails",
            "status = 'running', attempts = 1, locked_by = 'w', "
            "lease_expires_at = now() + interval '1 hour'",
        )
        add(conn, "default", "status = 'completed', attempts = 1, completed_at = now()")
        add(
            conn,
            "default",
            "status = 'failed', attempts = 3, failed_at = now(), last_error = 'boom'",
        )
        add(conn, "emails", "status = 'discarded', attempts = 1, last_error = 'bad'")
        add(conn, "emails", "status = 'cancelled'")
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM dispatcher_jobs GROUP BY status").fetchall()
        )
    assert statuses == {
        "queued": counted + 4,
        "waiting": 1,
        "running": 2,
        "completed": 1,
        "failed": 1,
        "discarded": 1,
        "cancelled": 1,
    }, statuses
    assert backlog(dsn, query) == counted
    # A delayed job counts once it is due (+1), and a due one no more once finished (-1).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs SET run_at = now() "
            "WHERE queue_name = 'emails' AND status = 'queued' AND run_at > now()"
        )
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', completed_at = now()"
            " WHERE id = (SELECT min(id) FROM dispatcher_jobs"
            " WHERE queue_name = 'default' AND status = 'queued' AND run_at <= now())"
        )
    assert backlog(dsn, query) == counted
    # A paused queue's jobs: no worker claims them, so they ask for no pod, until it is resumed.
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dispatcher_jobs WHERE queue_name = 'emails'"
            " AND status = 'queued' AND run_at <= now()"
        ).fetchone()
    assert row is not None and row[0] == 3
    pause_queue(dsn, "emails")
    assert backlog(dsn, query) == counted - 3
    resume_queue(dsn, "emails")
    assert backlog(dsn, query) == counted


def test_it_stops_at_its_cap_and_reads_only_the_claim_index(dsn: str, query: str) -> None:
    cap = cap_of(query)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # More due jobs than the cap, over both queues, beside a table of finished ones.
        enqueue_payloads_sync(
            conn, "report.build", ({"n": i} for i in range(cap // 2 + 50)), queue="default"
        )
        enqueue_payloads_sync(
            conn, "report.build", ({"n": i} for i in range(cap // 2 + 50)), queue="emails"
        )
        enqueue_payloads_sync(conn, "report.build", ({"n": i} for i in range(cap)), queue=OTHER)
        enqueue_payloads_sync(
            conn, "report.build", ({"n": i} for i in range(cap)), queue="default", delay_s=3600
        )
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', completed_at = now()"
            " WHERE queue_name = %s AND id %% 2 = 0",
            (OTHER,),
        )
        # A table shaped as in production: the due backlog a few percent of it, the rest finished
        # (with the due jobs half the table, a sequential scan is the cheaper plan, and is chosen).
        conn.execute(
            "INSERT INTO dispatcher_jobs (queue_name, job_type, payload, bucket, status, run_at, "
            "completed_at) SELECT %s, 'report.build', '{}', g %% 64, 'completed', now(), now() "
            "FROM generate_series(1, 300000) AS g",
            (OTHER,),
        )
        conn.execute("VACUUM ANALYZE dispatcher_jobs")
        due = conn.execute(
            "SELECT count(*) FROM dispatcher_jobs WHERE queue_name IN ('default', 'emails')"
            " AND status = 'queued' AND run_at <= now()"
        ).fetchone()
        assert due is not None and due[0] == cap + 100
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + query).fetchone()
    assert backlog(dsn, query) == cap
    assert plan is not None
    nodes = list(walk(plan[0][0]["Plan"]))
    scans = [
        n for n in nodes if "Scan" in n["Node Type"] and n.get("Relation Name") == "dispatcher_jobs"
    ]
    used = [(n["Node Type"], n.get("Index Name")) for n in scans]
    assert used == [("Index Only Scan", "dispatcher_jobs_claim_idx")], scans
    paused = [n for n in nodes if n.get("Relation Name") == "dispatcher_paused_queues"]
    assert len(paused) == 1 and paused[0].get("Parent Relationship") == "InitPlan", (
        "read once per poll"
    )
    assert any(n["Node Type"] == "Limit" for n in nodes), "the cap is a LIMIT under the count"
    assert "= ANY ('{default,emails}'::text[])" in scans[0]["Index Cond"], (
        "the queue list folded to a constant"
    )


def walk(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)
