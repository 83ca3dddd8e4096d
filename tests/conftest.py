"""Test fixtures: a real PostgreSQL for every integration test, never a mock.

The server is `DISPATCHER_TEST_DSN` when set (any database on a server where we may CREATE
DATABASE), else a throwaway embedded PostgreSQL started once per session. Each test gets a fresh
database cloned from a template migrated once (procrastinate's pattern): isolated and ~50 ms.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.databases import dbname_of, scratch_database


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
    with scratch_database(pg_admin_dsn, "dispatcher_tmpl", migrated=True) as template_dsn:
        yield dbname_of(template_dsn)


@pytest.fixture
def dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A freshly migrated, empty database of its own for this test."""
    with scratch_database(pg_admin_dsn, "dispatcher_test", template=template_db) as test_dsn:
        yield test_dsn


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A database with no schema at all (migration tests)."""
    with scratch_database(pg_admin_dsn, "dispatcher_empty") as test_dsn:
        yield test_dsn


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
