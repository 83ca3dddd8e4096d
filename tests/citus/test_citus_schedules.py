"""Recurring jobs on a distributed jobs table: the single-node schedule tests, run on the cluster
(rounds, races for a slot, runs settled from their jobs, the CLI, a worker running each slot)."""

from __future__ import annotations

import pytest

from tests.integration.test_schedules import *  # noqa: F403


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
