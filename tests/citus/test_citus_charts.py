"""The charts on a distributed jobs table: the rollup's tables stay local to the coordinator node,
a worker's counts flush and roll up there, the depth sample reads the distributed table, and the
pages draw them (the single-node tests, run on the cluster)."""

from __future__ import annotations

import pytest

from tests.integration.test_queue_stats import *  # noqa: F403
from tests.web.test_charts_page import *  # noqa: F403


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
