"""The dashboard on a distributed jobs table: the single-node HTTP tests (every page with its data,
the actions with CSRF, escaping, bounded answers) run on the cluster, where the bucket map reads
its queues and backlog bucket by bucket (dispatcher/web/reads.py)."""

from __future__ import annotations

import pytest

from tests.web.test_http import *  # noqa: F403


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
