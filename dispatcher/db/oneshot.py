"""The connections of one-shot commands (`dispatcher status`, `enqueue`, `jobs ...`, `grants`, and
admin's API given a DSN): none of them may hang on a lock or a slow statement.

`session()` opens one through coordinator/pg/connect.py (bounded connect, errors classified);
`bounded_transaction()` runs a unit of work in a transaction with a local lock_timeout (the
statement timeout setting, 5 s by default) and statement_timeout (a multiple of it), so a command
blocked by a migration or a long transaction gives up with one line that says what it waited for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits, connect_sync, local_timeouts
from dispatcher.db import rows
from dispatcher.db.queries import query
from dispatcher.db.translate import connect_errors, translate_errors
from dispatcher.errors import StoreTimeout

_DIAGNOSIS_S = 1.0  # the bound of the query that names the locked table, after a lock timeout


@contextlib.contextmanager
def session(
    dsn: str, limits: ConnectionLimits, *, application_name: str
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for the block, closed after; StoreUnavailable or StoreRefused
    (one line naming the server) when it cannot be opened."""
    with connect_errors(dsn):
        conn = connect_sync(dsn, limits, application_name=application_name)
    with conn:
        yield conn


@contextlib.contextmanager
def bounded_transaction(
    conn: psycopg.Connection[Any], what: str, limits: ConnectionLimits, *, budget: float = 1.0
) -> Iterator[None]:
    """The block in one transaction of `conn`, where a lock wait ends after statement_timeout_s
    and a statement after statement_timeout_s x `budget`; psycopg errors become ours (translate.py),
    a timeout a StoreTimeout that says which (and which of our tables is locked, if one is)."""
    statement_s = limits.statement_timeout_s * budget
    lock_s = min(limits.statement_timeout_s, statement_s)
    try:
        with translate_errors(what), conn.transaction():
            local_timeouts(conn, statement_s, lock_s)
            yield
    except StoreTimeout as exc:
        if exc.lock:
            raise StoreTimeout(
                f"{what}: gave up after {lock_s:g} s waiting for a lock{_held(conn)} "
                "(lock_timeout); is a migration or a long transaction holding it?",
                lock=True,
            ) from None
        raise StoreTimeout(
            f"{what}: gave up after {statement_s:g} s (statement_timeout)", lock=False
        ) from None


def _held(conn: psycopg.Connection[Any]) -> str:
    """' on dispatcher_jobs': our tables another session holds a lock on that blocks reads or
    writes; '' if none (a row lock, or released meanwhile) or if asking fails."""
    try:
        with conn.transaction():
            local_timeouts(conn, _DIAGNOSIS_S, _DIAGNOSIS_S)
            tables = rows.values(conn.execute(query("locked_tables"), prepare=False))
    except psycopg.Error:
        return ""
    return f" on {', '.join(tables)}" if tables else ""
