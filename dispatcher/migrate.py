"""Versioned schema migrations, safe when N pods run `dispatcher migrate` at the same moment.

Each package ships the migrations of the tables it owns, as `<package>/sql/migrations/NNNN_name.sql`:
dispatcher the jobs table, coordinator its coordination tables. Together they form ONE version
sequence (a version number is unique across both packages; a clash is refused before anything
runs), recorded in one `dispatcher_schema_version` table, so a database migrated when all files
lived in dispatcher/ sees nothing new.

The applied versions are read first, with plain SELECTs: when nothing is missing, that is all, so
any role that may SELECT the version table (a workers' DML-only role too) gets "up to date"
without running any DDL. Otherwise the missing ones are applied in version order inside ONE
transaction that first takes a transaction-scoped advisory lock and reads the versions again:
concurrent runners queue behind it, then see the versions the winner recorded and apply nothing.
Transaction-scoped (not session) locks also work behind PgBouncer in transaction pooling mode.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import psycopg

from coordinator.pglimits import ConnectionLimits

from .constants import MIGRATE_LOCK_KEY
from .dsn import describe_dsn, one_line
from .errors import MigrationError

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")

# Packages whose sql/migrations/ make up the schema.
MIGRATION_PACKAGES: Final = ("dispatcher", "coordinator")

# Not in a migration: it records them. privileges.py grants SELECT on it to workers.
VERSION_TABLE: Final = "dispatcher_schema_version"
_VERSION_TABLE_EXISTS = "SELECT to_regclass('dispatcher_schema_version') IS NOT NULL"
_APPLIED_VERSIONS = "SELECT version FROM dispatcher_schema_version"
_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS dispatcher_schema_version (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    package: str = "dispatcher"


def available_migrations(packages: Iterable[str] = MIGRATION_PACKAGES) -> list[Migration]:
    """The migrations of `packages`, merged into one sequence by version."""
    found: list[Migration] = []
    for package in packages:
        folder = resources.files(package).joinpath("sql", "migrations")
        if not folder.is_dir():  # e.g. a build that did not ship the .sql files: never skip silently
            raise MigrationError(f"no migrations folder in package {package!r}")
        for entry in folder.iterdir():
            match = _FILE.match(entry.name)
            if match:
                found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8"), package))
    found.sort(key=lambda m: (m.version, m.package, m.name))
    for a, b in itertools.pairwise(found):
        if a.version == b.version:
            raise MigrationError(f"two migrations share version {a.version}: "
                                 f"{a.package}/{a.version:04d}_{a.name}.sql and {b.package}/{b.version:04d}_{b.name}.sql")
    return found


def migrate(dsn: str, packages: Iterable[str] = MIGRATION_PACKAGES) -> list[int]:
    """Bring the schema up to date; returns the versions applied by this call (often none)."""
    migrations = available_migrations(packages)
    wanted = {m.version for m in migrations}
    try:
        # Prepared statements off: each statement runs once or twice, and behind PgBouncer < 1.21
        # a prepared one would not follow us to the next server connection.
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None,
                             **ConnectionLimits().connect_kwargs()) as conn:
            if wanted <= _applied(conn):
                return []
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
                conn.execute(_CREATE_VERSION_TABLE)
                done = _applied(conn)  # again, under the lock: a concurrent runner may have applied them
                applied = []
                for migration in migrations:
                    if migration.version in done:
                        continue
                    log.info("applying migration %s/%04d_%s", migration.package, migration.version, migration.name)
                    conn.execute(migration.sql.encode())  # bytes: run as a multi-statement script
                    conn.execute(
                        "INSERT INTO dispatcher_schema_version (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                    applied.append(migration.version)
                return applied
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MigrationError(f"migration failed: {exc} (migrations must run as the role that owns the "
                             "dispatcher tables, not as the workers' role: README, Roles)") from exc
    except psycopg.Error as exc:
        # One line without the password (libpq may quote the DSN), and not chained: a logged
        # traceback would print the psycopg error's own text.
        raise MigrationError(f"migration of {describe_dsn(dsn)} failed: {one_line(exc, dsn)}") from None


def _applied(conn: psycopg.Connection[Any]) -> set[int]:
    """The versions recorded in the database (none without a version table). SELECTs only."""
    exists = conn.execute(_VERSION_TABLE_EXISTS).fetchone()
    if not exists or not exists[0]:
        return set()
    return {row[0] for row in conn.execute(_APPLIED_VERSIONS)}


def current_version(dsn: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True, **ConnectionLimits().connect_kwargs()) as conn:
        exists = conn.execute(_VERSION_TABLE_EXISTS).fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT max(version) FROM dispatcher_schema_version").fetchone()
        return row[0] if row else None
