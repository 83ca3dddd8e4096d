"""Test fixtures: a real PostgreSQL for every integration test, never a mock.

The server is `DISPATCHER_TEST_DSN` when set (any database on a server where we may CREATE
DATABASE), else a throwaway embedded PostgreSQL started once per session. Each test gets a fresh
database cloned from a template migrated once (procrastinate's pattern): isolated and ~50 ms.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from dispatcher.migrate import migrate


def _with_dbname(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    dsn = os.environ.get("DISPATCHER_TEST_DSN")
    if dsn:
        yield dsn
        return
    from dispatcher.devtools.embedded import start_postgres

    server = start_postgres(durable=False, max_connections=300)
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> Iterator[str]:
    name = f"dispatcher_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(_with_dbname(pg_admin_dsn, name))
    yield name
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A freshly migrated, empty database of its own for this test."""
    name = f"dispatcher_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db)))
    yield _with_dbname(pg_admin_dsn, name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A database with no schema at all (migration tests)."""
    name = f"dispatcher_empty_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _with_dbname(pg_admin_dsn, name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """`DISPATCHER_TEST_REDIS_URL` when set, else one throwaway Redis for the session. Tests that
    kill or freeze Redis start a server of their own instead."""
    url = os.environ.get("DISPATCHER_TEST_REDIS_URL")
    if url:
        yield url
        return
    from dispatcher.devtools.embedded import start_redis

    server = start_redis()
    try:
        yield server.url
    finally:
        server.stop()
