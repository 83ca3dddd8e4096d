"""Least privilege: what the workers' role may do, as GRANT statements (`dispatcher grants`).

The owner migrates; the workers' role only reads and writes rows, and calls our SQL functions
(docs/operations/roles.md). The tables, sequences and functions come from the migrations
themselves, so a new one is granted without a list to update; a test compares the result with a
migrated database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from psycopg import sql

from dispatcher.db.migrate import MIGRATION_PACKAGES, VERSION_TABLE, available_migrations
from dispatcher.db.queries import query

_COMMENT = re.compile(r"--[^\n]*")
_CREATE_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\(", re.IGNORECASE)
_DROP_TABLE = re.compile(r"\bDROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_CREATE_FUNCTION = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\(", re.IGNORECASE
)
_DROP_FUNCTION = re.compile(r"\bDROP\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_ADD_COLUMN = re.compile(
    r"\bALTER\s+TABLE\s+(?:ONLY\s+)?(\w+)\s+ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?([^;]*)",
    re.IGNORECASE,
)
# A column backed by a sequence: `id bigint GENERATED ... AS IDENTITY` or `id bigserial`.
_SEQUENCE_COLUMN = re.compile(
    r"^\s*(\w+)\s+(?:\w*serial\d?\b|.*\bGENERATED\s+(?:ALWAYS|BY\s+DEFAULT)\s+AS\s+IDENTITY)",
    re.IGNORECASE,
)

# Rows only. DELETE: the pruner deletes finished jobs, members leave, a leader resigns, a worker
# gives up its maintenance lease (dispatcher_maintenance_leases: the table sampler's role).
TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
SEQUENCE_PRIVILEGES = "USAGE, SELECT"
# Workers check the schema version at start and `dispatcher migrate` reads it; only the owner writes
# it.
VERSION_TABLE_PRIVILEGES = "SELECT"
# Our functions (dispatcher_enqueue, migration 0018): the migration takes EXECUTE from PUBLIC.
FUNCTION_PRIVILEGES = "EXECUTE"
ANALYZED_TABLE = "dispatcher_jobs"  # the table PlannerStats refreshes statistics of


@dataclass(frozen=True, slots=True)
class SchemaObjects:
    tables: tuple[str, ...]  # in the order the migrations create them
    sequences: tuple[str, ...]
    functions: tuple[str, ...] = ()  # each name has one signature: granted by name alone


def _closing_paren(text: str, start: int) -> int:
    """Index of the parenthesis that closes the one just before `start`."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced parentheses in a CREATE TABLE")


def _columns(body: str) -> list[str]:
    """The top-level, comma-separated items of a CREATE TABLE body."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in body:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return items


def schema_objects(packages: Iterable[str] = MIGRATION_PACKAGES) -> SchemaObjects:
    """Our tables, sequences and functions, from the migrations in version order (the version
    table first)."""
    tables: dict[str, None] = {VERSION_TABLE: None}
    sequences: dict[str, None] = {}
    functions: dict[str, None] = {}
    for migration in available_migrations(packages):
        text = _COMMENT.sub("", migration.sql)
        changes = [(c.start(), True, c[1]) for c in _CREATE_FUNCTION.finditer(text)]
        changes += [(d.start(), False, d[1]) for d in _DROP_FUNCTION.finditer(text)]
        for _, created, function in sorted(changes):
            if created:
                functions[function] = None
            else:
                functions.pop(function, None)
        events: list[tuple[int, str, str, str]] = []  # (position, kind, table, detail)
        for m in _CREATE_TABLE.finditer(text):
            events.append(
                (m.start(), "create", m[1], text[m.end() : _closing_paren(text, m.end())])
            )
        events += [(m.start(), "drop", m[1], "") for m in _DROP_TABLE.finditer(text)]
        events += [(m.start(), "add", m[1], m[2]) for m in _ADD_COLUMN.finditer(text)]
        for _, kind, table, detail in sorted(events):
            if kind == "drop":
                tables.pop(table, None)
                for seq in [s for s in sequences if s.startswith(f"{table}_")]:
                    sequences.pop(seq)
                continue
            tables[table] = None
            for column in _columns(detail) if kind == "create" else [detail]:
                match = _SEQUENCE_COLUMN.match(column)
                if match:
                    sequences[f"{table}_{match[1]}_seq"] = None  # PostgreSQL's default name for it
    return SchemaObjects(tuple(tables), tuple(sequences), tuple(functions))


def worker_grants(role: str, schema: str = "public", objects: SchemaObjects | None = None) -> str:
    """The GRANT statements that let `role` run workers, enqueue and read status, and nothing more:
    a script the owner of the tables runs (idempotent: run it again after every upgrade)."""
    if not role.strip():
        raise ValueError("role must not be empty")
    objects = objects or schema_objects()
    who = sql.Identifier(role).as_string()
    where = sql.Identifier(schema).as_string()

    def qualified(name: str) -> str:
        return f"{where}.{sql.Identifier(name).as_string()}"

    lines = [
        f"-- The workers' role {who}: rows of the dispatcher tables only, no DDL. Run as the owner "
        "of",
        "-- the tables (the role that runs `dispatcher migrate`), in the application's database; "
        "again",
        "-- after each upgrade. CONNECT and TEMPORARY on the database (PUBLIC has both by default) "
        "are",
        "-- needed too: enqueue_many with dedupe keys stages rows in a temporary table.",
        _grant("grant_schema_usage", schema=where, role=who),
    ]
    for table in objects.tables:
        privileges = VERSION_TABLE_PRIVILEGES if table == VERSION_TABLE else TABLE_PRIVILEGES
        lines.append(_grant("grant_table", privileges=privileges, table=qualified(table), role=who))
    lines += [
        _grant("grant_sequence", privileges=SEQUENCE_PRIVILEGES, sequence=qualified(s), role=who)
        for s in objects.sequences
    ]
    lines += [
        _grant("grant_function", privileges=FUNCTION_PRIVILEGES, function=qualified(f), role=who)
        for f in objects.functions
    ]
    lines += [
        "-- Optional (PostgreSQL 17+): let workers refresh planner statistics right after a bulk "
        "load;",
        "-- without it autovacuum does, within about a minute, and each worker logs once that it "
        "cannot.",
        f"-- GRANT MAINTAIN ON TABLE {qualified(ANALYZED_TABLE)} TO {who};",
        "-- Optional: let the table sampler's dispatcher_db_active_sessions count the sessions of "
        "other",
        "-- roles too (PostgreSQL shows a role the state of its own sessions only).",
        f"-- GRANT pg_read_all_stats TO {who};",
    ]
    return "\n".join(lines) + "\n"


def _grant(name: str, **parts: str) -> str:
    """A GRANT of sql/admin.sql with its {placeholders} filled in (quoted identifiers, privilege
    lists)."""
    text = query(name)
    for key, value in parts.items():
        text = text.replace("{" + key + "}", value)
    return text + ";"
