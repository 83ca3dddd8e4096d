"""Fixtures of the coordination backend contract suite (tests/contract/).

`backend_factory` is parametrized over every backend: `postgres` (session advisory locks),
`postgres_leases_only` (`session_locks=False`, as behind PgBouncer) and `redis`. Each test gets
a cluster of its own: a fresh migrated PostgreSQL database (the `dsn` fixture of
tests/conftest.py) or a unique key prefix on one throwaway Redis per session
(`DISPATCHER_TEST_REDIS_URL` when set). `restartable_factory` is the same over a server this test
may take away and bring back (PostgreSQL: the database refuses connections and its sessions are
ended; Redis: a private server killed and restarted).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.contract.support import KINDS, BackendFactory, PostgresFactory, RedisFactory


@pytest.fixture(params=KINDS)
def backend_factory(request: pytest.FixtureRequest) -> Iterator[BackendFactory]:
    if request.param == "redis":
        factory = RedisFactory(
            request.getfixturevalue("redis_url"), f"contract-{uuid.uuid4().hex[:12]}"
        )
        yield factory
        factory.delete_keys()
    else:
        yield PostgresFactory(
            request.getfixturevalue("dsn"), session_locks=request.param == "postgres"
        )


@pytest.fixture(params=KINDS)
def restartable_factory(request: pytest.FixtureRequest) -> Iterator[BackendFactory]:
    if request.param == "redis":
        from dispatcher.devtools.embedded import start_redis

        with start_redis() as server:
            yield RedisFactory(server.url, "contract", server=server)
    else:
        yield PostgresFactory(
            request.getfixturevalue("dsn"),
            session_locks=request.param == "postgres",
            admin_dsn=request.getfixturevalue("pg_admin_dsn"),
        )
