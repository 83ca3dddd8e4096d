"""Scratch databases on a test server: created per test (or once, as a template) and dropped after.

Shared by the suite's fixtures (tests/conftest.py) and the chaos tier's (tests/chaos/conftest.py),
which run the same pattern on servers of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from dispatcher.db.migrate import migrate


def with_dbname(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


@contextmanager
def scratch_database(
    admin_dsn: str, prefix: str, *, template: str | None = None, migrated: bool = False
) -> Iterator[str]:
    """A new database named `prefix_<pid>_<random>` (a copy of `template` if given; migrated if
    asked), yielded as a DSN and dropped afterwards, WITH (FORCE) so leftover sessions of killed
    workers cannot keep it alive."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(create)
    dsn = with_dbname(admin_dsn, name)
    try:
        if migrated:
            migrate(dsn)
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def dbname_of(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]  # type: ignore[return-value]
