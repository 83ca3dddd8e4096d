"""Progress and metadata from inside handlers, on a real Worker and PostgreSQL: handlers that
report in a tight loop (async, and sync in a thread) cost a bounded number of statements, counted
by the flusher and by dispatcher_progress_writes_total, not one per report; what they reported is
on their rows while they run; and once they completed, `dispatcher jobs show` (text and JSON)
shows each one's last progress and its merged meta."""

from __future__ import annotations

import asyncio
import time

import orjson
import psycopg

from dispatcher import Config, Job, Registry, Worker, enqueue_sync
from dispatcher.observe import metrics
from tests.helpers import run_async, run_worker_until, status_counts
from tests.integration.test_cli_errors import cli

FLUSH_S = 0.2
# The handlers report until the flusher has written this many batches while they run.
WRITES_WHILE_RUNNING = 3
BATCH = 200  # reports between two yields of the async handler: a tight loop


def progress_writes() -> float:
    return metrics.PROGRESS_WRITES._value.get()  # the counter's value in this process


def shown_fields(text: str) -> dict[str, str]:
    """`jobs show`'s lines of the job's fields (two spaces, the name, its value), by name."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if line.startswith("  ") and value:
            fields[name] = value.strip()
    return fields


def test_a_chatty_handlers_reports_cost_a_few_batched_statements_and_jobs_show_the_last(
    dsn: str,
) -> None:
    registry = Registry()
    worker: Worker
    reports: dict[str, int] = {}

    def written() -> int:
        return worker.services.progress.stats.writes

    @registry.handler("chatty")
    async def chatty(job: Job) -> None:
        await job.update_meta({"source": "s3", "rows": 0})
        deadline = time.monotonic() + 30
        n = 0
        while written() < WRITES_WHILE_RUNNING:
            assert time.monotonic() < deadline, "the flusher wrote no batches"
            for _ in range(BATCH):
                n += 1
                await job.set_progress({"done": n})
            await job.update_meta({"rows": n})
            await asyncio.sleep(0)  # the event loop's turn: the flusher runs on it
        await job.set_progress({"done": n, "total": n})
        await job.update_meta({"rows": n, "finished": True})
        reports["async"] = n + 2

    @registry.handler("chatty_sync")
    def chatty_sync(job: Job) -> None:
        deadline = time.monotonic() + 30
        n = 0
        while written() < WRITES_WHILE_RUNNING:
            assert time.monotonic() < deadline, "the flusher wrote no batches"
            n += 1
            job.set_progress_sync(n)
        job.update_meta_sync({"thread": True})
        job.set_progress_sync(100)
        reports["sync"] = n + 2

    with psycopg.connect(dsn, autocommit=True) as conn:
        chatty_id = enqueue_sync(conn, "chatty", {})
        sync_id = enqueue_sync(conn, "chatty_sync", {})
    config = Config(dsn=dsn, poll_interval_s=0.1, flush_interval_s=0.01, progress_flush_s=FLUSH_S)
    worker = Worker(config.replace(), registry)
    before = progress_writes()
    run_async(
        run_worker_until(
            worker, lambda: status_counts(dsn) == {"completed": 2}, 60, "both jobs completed"
        )
    )
    stats = worker.services.progress.stats
    # Reports in the thousands; statements: the batches written while both ran (none fenced:
    # each job still ran under its token), one more at most for the reports made until the
    # handlers saw the last of them, and one before each job's completion (its last reports).
    assert reports["async"] >= WRITES_WHILE_RUNNING * BATCH and reports["sync"] > 0
    assert WRITES_WHILE_RUNNING <= stats.writes <= WRITES_WHILE_RUNNING + 1 + 2, stats
    assert progress_writes() - before == stats.writes
    assert stats.fenced == 0 and stats.meta_refused == 0

    shown = cli("jobs", "show", str(chatty_id), "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    fields = shown_fields(shown.stdout)
    n = reports["async"] - 2
    assert orjson.loads(fields["progress"]) == {"done": n, "total": n}
    assert orjson.loads(fields["meta"]) == {"source": "s3", "rows": n, "finished": True}
    as_json = orjson.loads(cli("jobs", "show", str(sync_id), "--json", "--dsn", dsn).stdout)
    assert (as_json["job"]["progress"], as_json["job"]["meta"]) == (100, {"thread": True})
    assert as_json["job"]["status"] == "completed"
