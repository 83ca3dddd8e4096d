"""Migrations in steps (dispatcher/db/migrate.py): how a file is split, and what is refused."""

import re

import pytest

from dispatcher.db.migrate import Migration, available_migrations
from dispatcher.errors import MigrationError


def test_a_file_without_step_lines_is_one_transaction():
    steps = Migration(1, "x", "CREATE TABLE a (id int);\nCREATE TABLE b (id int);\n").steps
    assert [s.autocommit for s in steps] == [False]


def test_step_lines_split_a_file_and_autocommit_statements_run_one_by_one():
    sql = """-- catalog only
SET LOCAL lock_timeout = '5s';
ALTER TABLE t ADD COLUMN c int;
-- step: transaction
ALTER TABLE t VALIDATE CONSTRAINT k;
-- step: autocommit
-- a comment; with a semicolon
CREATE INDEX CONCURRENTLY IF NOT EXISTS i1 ON t (c);
DROP INDEX CONCURRENTLY IF EXISTS i0;
"""
    steps = Migration(7, "x", sql).steps
    assert [s.autocommit for s in steps] == [False, False, True]
    assert "lock_timeout" in steps[0].sql and "VALIDATE" not in steps[0].sql
    assert steps[2].statements == [
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS i1 ON t (c)",
        "DROP INDEX CONCURRENTLY IF EXISTS i0",
    ]


def test_an_empty_step_is_dropped():
    steps = Migration(
        7, "x", "-- step: autocommit\n-- nothing here\n-- step: transaction\nSELECT 1;\n"
    ).steps
    assert [s.autocommit for s in steps] == [False]


@pytest.mark.parametrize(
    "sql, message",
    [
        ("-- step: sometimes\nSELECT 1;", "unknown step kind"),
        ("-- step: autocommit\nDO $$ BEGIN PERFORM 1; END $$;", r"\$\$ body"),
    ],
)
def test_what_cannot_run_as_written_is_refused(sql, message):
    with pytest.raises(MigrationError, match=message):
        Migration(9, "bad", sql).steps  # noqa: B018  (the property raises: that is the test)


def test_the_cancel_migration_changes_the_catalog_then_scans_then_builds_indexes_concurrently():
    (migration,) = [m for m in available_migrations() if m.name == "cancel_and_retention"]
    catalog, validate, indexes = migration.steps
    code = re.sub(r"--[^\n]*", "", catalog.sql)
    assert not catalog.autocommit and "lock_timeout" in code and "NOT VALID" in code
    assert "VALIDATE" not in code and "CREATE INDEX" not in code
    assert (
        not validate.autocommit
        and re.sub(r"--[^\n]*", "", validate.sql).count("VALIDATE CONSTRAINT") == 2
    )
    assert indexes.autocommit and all("CONCURRENTLY" in s for s in indexes.statements)
    every_step = [s for m in available_migrations() for s in m.steps]  # none is refused
    assert every_step
