"""The Citus tier's fixtures: one cluster per session (a coordinator node and two worker nodes,
each its own PostgreSQL 15), and per test a distributed database of its own, cloned on every node
from a template that was migrated and distributed once. Skipped, with the reason, where Citus is
not installed; `.ci/run` installs it, so CI never skips."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from dispatcher.db.citus import distribute
from dispatcher.db.migrate import migrate
from dispatcher.devtools.citus_cluster import CitusCluster, citus_missing


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[CitusCluster]:
    missing = citus_missing()
    if missing is not None:
        reason = f"{missing}: install Citus 13.2 for PostgreSQL 15 (docs/concepts/citus.md)"
        if os.environ.get("DISPATCHER_TEST_CITUS") == "required":  # CI: never a silent skip
            pytest.fail(reason)
        pytest.skip(reason)
    with CitusCluster(workers=2) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def citus_template(citus_cluster: CitusCluster) -> Iterator[str]:
    name = f"citus_tmpl_{os.getpid()}"
    with citus_cluster.database(name) as dsn:
        migrate(dsn)
        distribute(dsn)
        yield name


@pytest.fixture
def citus_dsn(citus_cluster: CitusCluster, citus_template: str) -> Iterator[str]:
    """A migrated database distributed by bucket, empty, of this test's own."""
    with citus_cluster.database(
        f"citus_test_{uuid.uuid4().hex[:8]}", template=citus_template
    ) as dsn:
        citus_cluster.wait_ready(dsn)
        yield dsn


@pytest.fixture
def citus_empty_dsn(citus_cluster: CitusCluster) -> Iterator[str]:
    """A database with Citus and the worker nodes, but no schema."""
    with citus_cluster.database(f"citus_empty_{uuid.uuid4().hex[:8]}") as dsn:
        yield dsn


# Worker processes (`dispatcher run`) and a Redis of their own, as the chaos tier starts them.
from tests.chaos.conftest import chaos_redis, workers  # noqa: E402, F401  # fixtures, used by name
