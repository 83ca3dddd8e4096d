"""The worker's integration tests (tests/integration/test_worker.py) on a distributed jobs table:
outcomes, retries, timeouts, leases and the reaper, each job's writes routed to its bucket."""

from __future__ import annotations

import pytest

from tests.integration.test_worker import *  # noqa: F403

# Its retry log is a trigger on the jobs table, which Citus does not run on a distributed table.
del test_retries_land_in_the_future_with_growing_delay_then_fail  # noqa: F821


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
