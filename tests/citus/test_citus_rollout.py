"""The rollout tests (tests/integration/test_rollout.py) on a distributed jobs table: old workers
hand the new type's jobs back bucket by bucket, each hand-back routed to its bucket, and none
fails; the registry and the schedules lease live on the coordinator node."""

from __future__ import annotations

import pytest

from tests.integration.test_rollout import *  # noqa: F403


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
