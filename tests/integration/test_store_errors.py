"""Our store exceptions carry what PostgreSQL said, DETAIL and HINT included, on one line: a log
line that quotes one stays one line (the log formats: docs/operations/logs.md)."""

import io
import logging

import psycopg
import pytest

from dispatcher.db.translate import translate_errors
from dispatcher.errors import StoreConflict, StoreError
from dispatcher.observe import logs


def raised(dsn: str, sql: str, params=None) -> StoreError:
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(StoreError) as info,
        translate_errors("test statement", dsn),
    ):
        conn.execute(sql, params)
    return info.value


def logged(exc: StoreError, log_format: str) -> str:
    """What a worker's log writes for `claim failed: <exc>`, in `log_format`."""
    stream = io.StringIO()
    handler = logs.configure(log_format, "INFO", stream=stream)
    try:
        logging.getLogger("dispatcher.runtime.producer").warning("claim failed: %s", exc)
    finally:
        logging.getLogger().removeHandler(handler)
    return stream.getvalue()


def test_a_multi_line_error_with_detail_and_hint_is_one_line_in_the_exception_and_the_log(dsn):
    error = raised(
        dsn,
        """DO $$ BEGIN RAISE EXCEPTION 'the first line
and the second'
    USING DETAIL = E'Row 1 is wrong.\\nRow 2 is wrong too.', HINT = 'Fix the rows.'; END $$""",
    )
    assert str(error) == (
        "test statement: the first line and the second; DETAIL: Row 1 is wrong.; Row 2 is wrong "
        "too.; HINT: Fix the rows."
    )
    for log_format in ("text", "json"):
        text = logged(error, log_format)
        assert text.count("\n") == 1 and text.endswith("\n"), text
        assert "Row 2 is wrong too.; HINT: Fix the rows." in text


def test_a_unique_violation_says_which_key(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k text PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES ('a')")
    error = raised(dsn, "INSERT INTO t VALUES ('a')")
    assert isinstance(error, StoreConflict)
    assert str(error) == (
        'test statement: duplicate key value violates unique constraint "t_pkey"; '
        "DETAIL: Key (k)=(a) already exists."
    )
