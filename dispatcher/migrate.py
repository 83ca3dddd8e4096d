"""Versioned schema migrations, safe when N pods run `dispatcher migrate` at the same moment.

Migrations are `sql/migrations/NNNN_name.sql`, applied in order inside ONE transaction that
first takes a transaction-scoped advisory lock: concurrent runners queue behind it, then see the
versions the winner recorded and apply nothing. Transaction-scoped (not session) locks also work
behind PgBouncer in transaction pooling mode.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from .constants import MIGRATE_LOCK_KEY
from .errors import MigrationError

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")

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


def available_migrations(package: str = "dispatcher") -> list[Migration]:
    folder = resources.files(package).joinpath("sql", "migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version number: {versions}")
    return found


def migrate(dsn: str, package: str = "dispatcher") -> list[int]:
    """Bring the schema up to date; returns the versions applied by this call (often none)."""
    migrations = available_migrations(package)
    try:
        with psycopg.connect(dsn, autocommit=False) as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
                conn.execute(_CREATE_VERSION_TABLE)
                done = {row[0] for row in conn.execute("SELECT version FROM dispatcher_schema_version")}
                applied = []
                for migration in migrations:
                    if migration.version in done:
                        continue
                    log.info("applying migration %04d_%s", migration.version, migration.name)
                    conn.execute(migration.sql.encode())  # bytes: run as a multi-statement script
                    conn.execute(
                        "INSERT INTO dispatcher_schema_version (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                    applied.append(migration.version)
                return applied
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {exc}") from exc


def current_version(dsn: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('dispatcher_schema_version') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT max(version) FROM dispatcher_schema_version").fetchone()
        return row[0] if row else None
