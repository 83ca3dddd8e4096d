"""Versioned schema migrations, safe when N pods run `dispatcher migrate` at the same moment.

Each package ships its own `sql/migrations/NNNN_name.sql`, in one version sequence. Nothing to
apply: plain SELECTs only. Otherwise a transaction-scoped advisory lock serialises runners (it
works through PgBouncer). A migration may be written in `-- step: transaction|autocommit` steps;
every step but the last must be idempotent. Details: docs/design/migrations.md.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import psycopg
from psycopg import sql

from coordinator.pg.connect import ConnectionLimits, connect_sync
from coordinator.pg.dsn import describe_dsn
from dispatcher.backoff import jittered
from dispatcher.constants import MIGRATE_LOCK_KEY
from dispatcher.db import rows
from dispatcher.db.queries import query
from dispatcher.db.translate import store_error
from dispatcher.errors import MigrationError, StorePermissionDenied

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_STEP = re.compile(r"^--\s*step:\s*(\w+)[^\n]*$", re.MULTILINE)
_STEP_KINDS = ("transaction", "autocommit")
_COMMENT = re.compile(r"--[^\n]*")
_CONCURRENT_INDEX = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE
)

# Packages whose sql/migrations/ make up the schema.
MIGRATION_PACKAGES: Final = ("dispatcher.db", "coordinator")

# Not in a migration: it records them. privileges.py grants SELECT on it to workers.
VERSION_TABLE: Final = "dispatcher_schema_version"
_TRY_LOCK_S = 0.2  # between tries of a runner waiting for another's migration
_WAIT_LOG_S = 10.0


@dataclass(frozen=True, slots=True)
class Step:
    autocommit: bool  # False: one transaction
    sql: str

    @property
    def statements(self) -> list[str]:
        """An autocommit step's statements, one by one (comments dropped)."""
        return [s.strip() for s in _COMMENT.sub("", self.sql).split(";") if s.strip()]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    package: str = "dispatcher.db"

    @property
    def steps(self) -> list[Step]:
        """The file's steps (see the module docstring); a file without step lines is one
        transaction."""
        where = f"{self.package}/{self.version:04d}_{self.name}.sql"
        marks = list(_STEP.finditer(self.sql))
        steps = [Step(False, self.sql[: marks[0].start()] if marks else self.sql)]
        for i, mark in enumerate(marks):
            if mark[1] not in _STEP_KINDS:
                raise MigrationError(
                    f"{where}: unknown step kind {mark[1]!r} (one of {', '.join(_STEP_KINDS)})"
                )
            end = marks[i + 1].start() if i + 1 < len(marks) else len(self.sql)
            steps.append(Step(mark[1] == "autocommit", self.sql[mark.end() : end]))
        steps = [s for s in steps if _COMMENT.sub("", s.sql).strip()]
        if any(s.autocommit and "$$" in s.sql for s in steps):
            raise MigrationError(
                f"{where}: an autocommit step cannot hold a $$ body (its statements are split at "
                "';')"
            )
        return steps


def available_migrations(packages: Iterable[str] = MIGRATION_PACKAGES) -> list[Migration]:
    """The migrations of `packages`, merged into one sequence by version."""
    found: list[Migration] = []
    for package in packages:
        folder = resources.files(package).joinpath("sql", "migrations")
        # e.g. a build that did not ship the .sql files: never skip silently
        if not folder.is_dir():
            raise MigrationError(f"no migrations folder in package {package!r}")
        for entry in folder.iterdir():
            match = _FILE.match(entry.name)
            if match:
                found.append(
                    Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8"), package)
                )
    found.sort(key=lambda m: (m.version, m.package, m.name))
    for a, b in itertools.pairwise(found):
        if a.version == b.version:
            raise MigrationError(
                f"two migrations share version {a.version}: "
                f"{a.package}/{a.version:04d}_{a.name}.sql and "
                f"{b.package}/{b.version:04d}_{b.name}.sql"
            )
    return found


def migrate(
    dsn: str, packages: Iterable[str] = MIGRATION_PACKAGES, *, up_to: int | None = None
) -> list[int]:
    """Bring the schema up to date (or up to version `up_to`); returns the versions applied by
    this call (often none)."""
    migrations = [m for m in available_migrations(packages) if up_to is None or m.version <= up_to]
    wanted = {m.version for m in migrations}
    try:
        with connect_migrator(dsn) as conn:
            if wanted <= _applied(conn):
                return []
            with connect_migrator(dsn) as lock_conn, _migration_lock(lock_conn):
                conn.execute(query("schema_version_create"))
                # again, under the lock: a concurrent runner may have applied them
                done = _applied(conn)
                applied = []
                for migration in migrations:
                    if migration.version in done:
                        continue
                    log.info(
                        "applying migration %s/%04d_%s",
                        migration.package,
                        migration.version,
                        migration.name,
                    )
                    _apply(conn, migration)
                    applied.append(migration.version)
                return applied
    except psycopg.Error as exc:
        # One line without the password (libpq may quote the DSN), and not chained: a logged
        # traceback would print the psycopg error's own text.
        error = store_error(exc, f"migration of {describe_dsn(dsn)} failed", dsn)
        if isinstance(error, StorePermissionDenied):
            raise MigrationError(
                f"{error} (migrations must run as the role that owns the dispatcher tables, "
                "not as the workers' role: docs/operations/roles.md)"
            ) from None
        raise MigrationError(str(error)) from None


def connect_migrator(dsn: str) -> psycopg.Connection[Any]:
    # Prepared statements off (connect_sync): each statement runs once or twice, and behind
    # PgBouncer < 1.21 a prepared one would not follow us to the next server connection.
    return connect_sync(dsn, ConnectionLimits(), application_name="dispatcher-migrate")


@contextlib.contextmanager
def _migration_lock(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Hold the migration lock for the block: a transaction of `conn` that took it. Tried, not
    waited for: a session blocked in pg_advisory_xact_lock holds a snapshot all the while, and the
    runner holding the lock would wait for that snapshot in CREATE INDEX CONCURRENTLY, forever.
    Between tries no transaction is open here."""
    next_log = time.monotonic()
    while True:
        conn.execute(query("migrate_begin"))
        locked = conn.execute(
            query("migrate_try_lock").replace("{key}", str(int(MIGRATE_LOCK_KEY)))
        ).fetchone()
        if rows.value(locked) is True:
            break
        conn.execute(query("migrate_rollback"))
        if time.monotonic() >= next_log:
            log.info("waiting for another runner of `dispatcher migrate` to finish")
            next_log = time.monotonic() + _WAIT_LOG_S
        time.sleep(jittered(_TRY_LOCK_S))
    try:
        yield
    finally:
        # nothing was written here: ending the transaction frees the lock
        conn.execute(query("migrate_rollback"))


def _apply(conn: psycopg.Connection[Any], migration: Migration) -> None:
    """Run a migration's steps in order, each committed; the version is recorded with the last."""
    steps = migration.steps
    record = {"version": migration.version, "name": migration.name}
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if step.autocommit:
            for statement in step.statements:
                _run_alone(conn, statement)
            if last:
                conn.execute(query("schema_version_record"), record)
        else:
            with conn.transaction():
                conn.execute(step.sql.encode())  # bytes: run as a multi-statement script
                if last:
                    conn.execute(query("schema_version_record"), record)
    if not steps:
        conn.execute(query("schema_version_record"), record)


def _run_alone(conn: psycopg.Connection[Any], statement: str) -> None:
    """One statement of an autocommit step. An index that CREATE INDEX CONCURRENTLY IF NOT EXISTS
    finds already there but invalid was left by a build cut short (we hold the migration lock, so
    nobody else is building it): it is dropped and built again."""
    conn.execute(statement.encode())
    index = _CONCURRENT_INDEX.search(statement)
    if index is None:
        return
    row = conn.execute(query("index_is_valid"), {"index": index[1]}).fetchone()
    if row is not None and not rows.value(row):
        log.warning(
            "index %s was left invalid by an interrupted build: building it again", index[1]
        )
        conn.execute(
            sql.SQL(query("index_drop_concurrently")).format(index=sql.Identifier(index[1]))
        )
        conn.execute(statement.encode())


def _applied(conn: psycopg.Connection[Any]) -> set[int]:
    """The versions recorded in the database (none without a version table). SELECTs only."""
    exists = conn.execute(query("schema_version_table_exists")).fetchone()
    if not rows.value(exists):
        return set()
    return set(rows.values(conn.execute(query("schema_versions_applied"))))


def current_version(dsn: str) -> int | None:
    with connect_migrator(dsn) as conn:
        exists = conn.execute(query("schema_version_table_exists")).fetchone()
        if not rows.value(exists):
            return None
        version: int | None = rows.value(conn.execute(query("schema_version_latest")).fetchone())
        return version
