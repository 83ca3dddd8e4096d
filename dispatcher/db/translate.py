"""psycopg errors -> the dispatcher's exceptions, by the one classification of
coordinator/pg/errors.py.

unreachable -> StoreUnavailable (retry later); lock or statement timeout -> StoreTimeout (a
StoreUnavailable); login refused, bad connection setting -> StoreRefused; missing schema ->
SchemaMissing (run `dispatcher migrate`); permission denied -> StorePermissionDenied; a unique
violation (23505) -> StoreConflict; anything else -> StoreError. Messages are one line and never
carry the password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

from coordinator.pg.errors import ConnectError, Problem, describe
from dispatcher.errors import (
    SchemaMissing,
    StoreConflict,
    StoreError,
    StorePermissionDenied,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)

MIGRATE_HINT = "run `dispatcher migrate` first"
UNIQUE_VIOLATION = "23505"


def store_error(exc: psycopg.Error, what: str, dsn: str | None = None) -> StoreError:
    """The exception `exc` stands for; `what` names the statement or command in its message."""
    if isinstance(exc, ConnectError):  # already one line naming the server: no `what`
        kind = (
            StoreRefused
            if exc.failure.problem in (Problem.LOGIN_REFUSED, Problem.BAD_SETTING)
            else StoreUnavailable
        )
        return kind(str(exc))
    failure = describe(exc, dsn)
    problem, reason = failure.problem, failure.reason
    if problem is Problem.UNREACHABLE:
        return StoreUnavailable(f"{what}: database unavailable: {reason}")
    if problem is Problem.TIMED_OUT:
        return StoreTimeout(
            f"{what}: {reason}", lock=not isinstance(exc, psycopg.errors.QueryCanceled)
        )
    if problem is Problem.MISSING_SCHEMA:
        return SchemaMissing(f"{what}: no dispatcher schema here ({reason}): {MIGRATE_HINT}")
    if problem is Problem.PERMISSION_DENIED:
        return StorePermissionDenied(f"{what}: {reason}", reason=reason, hint=failure.hint)
    if problem in (Problem.LOGIN_REFUSED, Problem.BAD_SETTING):
        return StoreRefused(f"{what}: {reason}")
    if failure.sqlstate == UNIQUE_VIOLATION:
        return StoreConflict(f"{what}: {reason}")
    return StoreError(f"{what}: {reason}")


@contextlib.contextmanager
def translate_errors(what: str, dsn: str | None = None) -> Iterator[None]:
    """Around statements: psycopg errors -> our exceptions (store_error), chained to the
    original."""
    try:
        yield
    except psycopg.Error as exc:
        raise store_error(exc, what, dsn) from exc


@contextlib.contextmanager
def connect_errors(dsn: str) -> Iterator[None]:
    """Around opening a connection (connect() or connect_sync() of coordinator/pg/connect.py):
    StoreUnavailable, StoreRefused or StoreError in one line that names the server. Not chained,
    since a logged traceback would print the psycopg error's own text (libpq may quote the DSN)."""
    try:
        yield
    except psycopg.Error as exc:
        raise store_error(exc, "connect", dsn) from None
