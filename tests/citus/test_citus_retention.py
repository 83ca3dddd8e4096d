"""Retention on a distributed jobs table: the single-node tests of the pruner, run on the cluster.
Each job kind's DELETE goes bucket by bucket there (a router query each: Citus refuses FOR UPDATE
over several shards); history rows and uniqueness windows live on the coordinator node."""

from __future__ import annotations

import pytest

from tests.integration.test_retention import *  # noqa: F403


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
