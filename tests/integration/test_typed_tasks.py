"""Typed tasks against a real PostgreSQL: `task.enqueue_sync(conn, ...)` in the caller's
transaction writes a job (its arguments by name), and a worker runs the function with them."""

from __future__ import annotations

import psycopg

from dispatcher import Config, Registry, Worker, current_job
from tests.helpers import fetchall, run_async, run_worker_until, status_counts


def test_a_task_enqueued_in_a_transaction_runs_on_a_worker_with_its_arguments(dsn: str) -> None:
    registry = Registry()
    received: list[tuple[str, str, list[str] | None, int]] = []

    @registry.task(queue="emails", max_attempts=3)
    async def send_email(to: str, subject: str, cc: list[str] | None = None) -> None:
        received.append((to, subject, cc, current_job().attempts))

    with psycopg.connect(dsn) as conn:  # one transaction: committed on leaving the block
        job_id = send_email.with_options(priority=1).enqueue_sync(
            conn, "ada@example.com", "Welcome", cc=["team@example.com"]
        )
        send_email.enqueue_sync(conn, "bob@example.com", subject="Hi")
    assert fetchall(
        dsn,
        "SELECT queue_name, job_type, payload, priority FROM dispatcher_jobs WHERE id = %s",
        [job_id],
    ) == [
        (
            "emails",
            "send_email",
            {"to": "ada@example.com", "subject": "Welcome", "cc": ["team@example.com"]},
            1,
        )
    ]

    config = Config(dsn=dsn, queues=("emails",), poll_interval_s=0.1, flush_interval_s=0.01)
    worker = Worker(config.replace(), registry)
    run_async(
        run_worker_until(
            worker, lambda: status_counts(dsn) == {"completed": 2}, 30, "both jobs completed"
        )
    )
    assert sorted(received) == [
        ("ada@example.com", "Welcome", ["team@example.com"], 1),
        ("bob@example.com", "Hi", None, 1),
    ]
