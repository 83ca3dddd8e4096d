"""Fixtures of the chaos tier: servers of its own, so that restarting, killing or partitioning
them can never touch a shared server (not even when DISPATCHER_TEST_DSN / DISPATCHER_TEST_REDIS_URL
point the rest of the suite at one), plus fault-injection proxies and tracked worker processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from dispatcher.db.migrate import migrate
from dispatcher.devtools.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    start_postgres,
    start_redis,
)
from tests.chaos.proxy import Proxy
from tests.chaos.support import Workers
from tests.databases import dbname_of, scratch_database


@pytest.fixture(scope="session")
def chaos_pg() -> Iterator[EmbeddedPostgres]:
    """The tier's own PostgreSQL, always (300 connections: a few workers x ~6 each, many tests)."""
    server = start_postgres(durable=False, max_connections=300)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def chaos_template(chaos_pg: EmbeddedPostgres) -> Iterator[str]:
    with scratch_database(chaos_pg.dsn, "chaos_tmpl", migrated=True) as template_dsn:
        yield dbname_of(template_dsn)


@pytest.fixture
def chaos_dsn(chaos_pg: EmbeddedPostgres, chaos_template: str) -> Iterator[str]:
    """A freshly migrated database of this test's own on chaos_pg."""
    with scratch_database(chaos_pg.dsn, "chaos_test", template=chaos_template) as dsn:
        yield dsn


@pytest.fixture
def chaos_empty_dsn(chaos_pg: EmbeddedPostgres) -> Iterator[str]:
    """A database on chaos_pg with no schema at all."""
    with scratch_database(chaos_pg.dsn, "chaos_empty") as dsn:
        yield dsn


@dataclass(frozen=True)
class RestartablePg:
    server: EmbeddedPostgres
    dsn: str  # a migrated database on `server`


@pytest.fixture
def restartable_pg() -> Iterator[RestartablePg]:
    """A PostgreSQL for this test alone, which it may stop, restart or crash, with a migrated
    database (thrown away with the server: no drop needed, whatever state the test left).

    Commits are synchronous (fsync stays off): an immediate shutdown is a crash of PostgreSQL,
    not of the machine, so no acknowledged write is lost, as on a production server, whereas
    asynchronous commit (the tier's speed setting) would lose the last ~200 ms of acknowledged
    commits and so test that opt-out rather than the dispatcher."""
    with start_postgres(
        durable=False, max_connections=100, settings={"synchronous_commit": True}
    ) as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        dsn = server.dsn_for("chaos")
        migrate(dsn)
        yield RestartablePg(server, dsn)


@pytest.fixture
def chaos_redis() -> Iterator[EmbeddedRedis]:
    """A Redis for this test alone: `.kill()` and `.start_again()` on the same port."""
    with start_redis() as server:
        yield server


@pytest.fixture
def proxy_to() -> Iterator[Callable[[str], Proxy]]:
    """proxy_to(dsn) -> a Proxy in front of that DSN's server (forwarding); closed at teardown."""
    proxies: list[Proxy] = []

    def make(dsn: str) -> Proxy:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        proxy = Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """Starts `dispatcher run` processes (workers.start(dsn, "w0", lease_s=3, ...)); any still
    alive at teardown are resumed if paused and SIGKILLed."""
    fleet = Workers(tmp_path)
    try:
        yield fleet
    finally:
        fleet.kill_all()
