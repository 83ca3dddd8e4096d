"""psycopg errors -> the dispatcher's exceptions, by the one classification of
coordinator/pg/errors.py.

unreachable -> StoreUnavailable (retry later); lock or statement timeout -> StoreTimeout (a
StoreUnavailable); login refused, bad connection setting -> StoreRefused; missing schema ->
SchemaMissing (run `dispatcher migrate`); permission denied -> StorePermissionDenied; a unique
violation (23505) -> StoreConflict; anything else -> StoreError. Messages are one line and never
carry the password: the server's DETAIL and HINT follow its message after "; ", and libpq's own
multi-line texts come with their lines joined by "; ", so every log of one is one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from coordinator.pg.dsn import one_line
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
# Of a DETAIL, at most: a check violation's quotes the whole row, payload included.
DETAIL_CHARS = 300


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
    problem, reason = failure.problem, said(exc, dsn)
    if problem is Problem.UNREACHABLE:
        return StoreUnavailable(f"{what}: database unavailable: {reason}")
    if problem is Problem.TIMED_OUT:
        return StoreTimeout(
            f"{what}: {reason}", lock=not isinstance(exc, psycopg.errors.QueryCanceled)
        )
    if problem is Problem.MISSING_SCHEMA:
        return SchemaMissing(f"{what}: no dispatcher schema here ({reason}): {MIGRATE_HINT}")
    if problem is Problem.PERMISSION_DENIED:
        return StorePermissionDenied(f"{what}: {reason}", reason=failure.reason, hint=failure.hint)
    if problem in (Problem.LOGIN_REFUSED, Problem.BAD_SETTING):
        return StoreRefused(f"{what}: {reason}")
    if failure.sqlstate == UNIQUE_VIOLATION:
        return StoreConflict(f"{what}: {reason}")
    return StoreError(f"{what}: {reason}")


def said(exc: BaseException, dsn: str | None = None) -> str:
    """What the server (or libpq) said, on one line, password redacted: its message, then
    `; DETAIL: ...` (at most DETAIL_CHARS) and `; HINT: ...` when it sent them; a text of libpq's
    own (a connection lost mid-statement: three lines) with its lines joined by '; '."""
    diag: Any = getattr(exc, "diag", None)  # psycopg's Diagnostic; None for our own errors
    primary = getattr(diag, "message_primary", None)
    if not primary:
        return _joined(str(exc), dsn) or type(exc).__name__
    parts = [_joined(primary, dsn)]
    detail, hint = diag.message_detail, diag.message_hint
    if detail:
        detail = _joined(detail, dsn)
        cut = detail if len(detail) <= DETAIL_CHARS else detail[: DETAIL_CHARS - 1] + "…"
        parts.append(f"DETAIL: {cut}")
    if hint:
        parts.append(f"HINT: {_joined(hint, dsn)}")
    return "; ".join(parts)


def _joined(text: str, dsn: str | None) -> str:
    """A multi-line text as one line: each line's whitespace collapsed, the lines joined by '; ',
    but a line that goes on with a small letter goes on after a space (libpq wraps its sentences:
    "... terminated abnormally\n\tbefore or while processing the request.")."""
    out = ""
    for raw in text.splitlines():
        line = one_line(raw, dsn)
        if line:
            out += line if not out else (" " if line[0].islower() else "; ") + line
    return out


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
