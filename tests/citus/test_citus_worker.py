"""The worker's integration tests (tests/integration/test_worker.py) on a distributed jobs table:
outcomes, retries, timeouts, leases and the reaper, each job's writes routed to its bucket."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher import Job, Registry, Worker
from tests.helpers import fetchval, run_async, run_worker_until, status_counts
from tests.integration.test_worker import *  # noqa: F403
from tests.integration.test_worker import config, enqueue, finished

# Its retry log is a trigger on the jobs table, which Citus does not run on a distributed table.
del test_retries_land_in_the_future_with_growing_delay_then_fail  # noqa: F821
# Its 1 s lease leaves no room on three nodes sharing 2 cores: a heartbeat round goes bucket by
# bucket through the coordinator node. The same test with wider margins follows.
del test_heartbeats_keep_a_long_job_leased  # noqa: F821


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn


def test_heartbeats_keep_a_long_job_leased_on_a_cluster(dsn: str) -> None:
    """Jobs that run past their lease keep it by heartbeats: none is reaped or run twice."""
    registry = Registry()
    runs: list[int] = []

    @registry.handler("long")
    async def long(job: Job) -> None:
        runs.append(job.id)
        await asyncio.sleep(7.0)

    enqueue(dsn, "long", 3)
    worker = Worker(
        config(dsn, lease_s=3, heartbeat_interval_s=0.5, reaper_interval_s=0.2), registry
    )
    run_async(run_worker_until(worker, finished(dsn, 3), 60, "long jobs completed"))
    assert status_counts(dsn) == {"completed": 3}
    assert len(runs) == 3 and worker.stats.reaped == 0 and worker.stats.leases_lost == 0
    assert fetchval(dsn, "SELECT max(attempts) FROM dispatcher_jobs") == 1
