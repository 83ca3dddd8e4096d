"""An in-process worker against a real PostgreSQL gives up on a handler that ignores its timeout:
it stops claiming, finishes its other jobs, keeps the stuck job's lease to the end (never given
back, never reaped while held) and ends with the stuck exit code. The re-run after the process
is gone: tests/chaos/test_stuck_handlers.py."""

import asyncio
import contextlib
import threading
import time

import psycopg
import pytest

from dispatcher import Config, Job, Registry, Worker, enqueue_payloads_sync
from dispatcher.serve.lifecycle import EXIT_STUCK
from tests.helpers import fetchall, run_async, status_counts, wait_until_async

LEASE_S = 1.0  # shorter than the job is held: only heartbeats keep it


def registry_with_stuck_handlers(release: threading.Event) -> Registry:
    registry = Registry()

    @registry.handler("deaf", timeout_s=0.2)
    async def deaf(job: Job) -> None:
        while not release.is_set():
            # ignores its timeout and the shutdown's interrupt alike
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    @registry.handler("blocked", timeout_s=0.2)
    def blocked(job: Job) -> None:
        release.wait(60)

    @registry.handler("quick")
    async def quick(job: Job) -> None:
        await asyncio.sleep(0.01)

    return registry


@pytest.mark.parametrize(
    "job_type", ["deaf", "blocked"], ids=["async-swallows-cancel", "sync-never-returns"]
)
def test_a_worker_gives_up_on_a_stuck_handler_keeps_its_lease_and_exits_with_the_stuck_code(
    dsn, job_type
):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, job_type, [{}], max_attempts=3)
    release = threading.Event()
    config = Config(
        dsn=dsn,
        poll_interval_s=0.1,
        flush_interval_s=0.01,
        reaper_interval_s=0.2,
        lease_s=LEASE_S,
        concurrency=4,
        stuck_grace_s=0.3,
        stuck_exit_after_s=1.0,
        shutdown_grace_s=1.0,
    )
    worker = Worker(config, registry_with_stuck_handlers(release))

    async def main() -> None:
        run = asyncio.create_task(worker.run())
        try:
            await wait_until_async(
                lambda: worker.stuck_watch.stuck or run.done(), 30, "the handler to be stuck"
            )
            # Still claiming while one of four slots is stuck: these run and complete.
            with psycopg.connect(dsn, autocommit=True) as conn:
                enqueue_payloads_sync(conn, "quick", [{}] * 5)
            await wait_until_async(
                lambda: worker.gave_up or run.done(), 30, "the worker to give up"
            )
            assert worker.vitals.gave_up and worker.stopping.is_set()
            given_up_at = time.monotonic()
            await asyncio.wait_for(asyncio.shield(run), 30)
            took_s = time.monotonic() - given_up_at
            assert took_s < config.shutdown_grace_s + 6, (
                "the shutdown bound holds from the give-up on"
            )
        finally:
            release.set()  # the handler ends (in a real process, it dies with the process)
            await asyncio.wait_for(run, 30)
            await wait_until_async(
                lambda: worker.executor.in_flight == 0, 10, "the released handler ended"
            )

    run_async(main())
    assert "has been stuck for" in (worker.gave_up or "")
    assert (worker.exit_code, worker.abandoned) == (EXIT_STUCK, 1)
    # Held to the end, past several lease lengths: never given back, never reaped.
    [(status, attempts, expiries, locked_by)] = fetchall(
        dsn,
        "SELECT status, attempts, lease_expiries, locked_by FROM dispatcher_jobs "
        "WHERE job_type = %s",
        (job_type,),
    )
    assert (status, attempts, expiries, locked_by) == ("running", 1, 0, config.worker_id)
    counts = status_counts(dsn)
    assert counts.get("completed", 0) + counts.get("queued", 0) == 5, counts  # none lost
