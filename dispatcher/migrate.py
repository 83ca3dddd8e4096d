"""Versioned schema migrations, safe when N pods run `dispatcher migrate` at the same moment.

Each package ships the migrations of the tables it owns, as `<package>/sql/migrations/NNNN_name.sql`:
dispatcher the jobs table, coordinator its coordination tables. Together they form ONE version
sequence (a version number is unique across both packages; a clash is refused before anything
runs), recorded in one `dispatcher_schema_version` table, so a database migrated when all files
lived in dispatcher/ sees nothing new. They are applied in version order inside ONE transaction that
first takes a transaction-scoped advisory lock: concurrent runners queue behind it, then see the
versions the winner recorded and apply nothing. Transaction-scoped (not session) locks also work
behind PgBouncer in transaction pooling mode.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Final

import psycopg

from coordinator.pglimits import ConnectionLimits

from .constants import MIGRATE_LOCK_KEY
from .dsn import describe_dsn, one_line
from .errors import MigrationError

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")

# Packages whose sql/migrations/ make up the schema.
MIGRATION_PACKAGES: Final = ("dispatcher", "coordinator")

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
    try:
        with psycopg.connect(dsn, autocommit=False, **ConnectionLimits().connect_kwargs()) as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
                conn.execute(_CREATE_VERSION_TABLE)
                done = {row[0] for row in conn.execute("SELECT version FROM dispatcher_schema_version")}
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
    except psycopg.Error as exc:
        # One line without the password (libpq may quote the DSN), and not chained: a logged
        # traceback would print the psycopg error's own text.
        raise MigrationError(f"migration of {describe_dsn(dsn)} failed: {one_line(exc, dsn)}") from None


def current_version(dsn: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True, **ConnectionLimits().connect_kwargs()) as conn:
        exists = conn.execute("SELECT to_regclass('dispatcher_schema_version') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT max(version) FROM dispatcher_schema_version").fetchone()
        return row[0] if row else None
