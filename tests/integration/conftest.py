"""Fixtures of the integration tests that need more than a database: PgBouncer in front of it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.pgbouncer import INSTALL_HINT, PgBouncer, pgbouncer_binary


@pytest.fixture
def pgbouncer(pg_admin_dsn: str) -> Iterator[PgBouncer]:
    """A PgBouncer of this test's own (pool_mode=transaction, trust) in front of the test
    PostgreSQL; `pgbouncer.dsn_for(dsn)` routes a database of that server through it. Skipped,
    saying how to install it, where the binary is missing."""
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    with psycopg.connect(pg_admin_dsn) as conn:
        user = conn.info.user  # the DSN's, or libpq's default (the OS user)
    with PgBouncer(pg_admin_dsn, binary=binary, users=(user,)) as bouncer:
        yield bouncer
