"""The one classification of PostgreSQL errors (coordinator/pg/errors.py): by SQLSTATE and psycopg's
exception types, never by message text (tests/integration/test_connection_errors.py: connects)."""

import psycopg
import pytest
from psycopg import errors as pgerrors

from coordinator.pg.errors import ConnectError, Failure, Problem, classify


@pytest.mark.parametrize(
    ("exc", "problem"),
    [
        (
            pgerrors.UndefinedTable('relation "dispatcher_jobs" does not exist'),
            Problem.MISSING_SCHEMA,
        ),
        (pgerrors.LockNotAvailable("canceling statement due to lock timeout"), Problem.TIMED_OUT),
        (pgerrors.QueryCanceled("canceling statement due to statement timeout"), Problem.TIMED_OUT),
        (pgerrors.DeadlockDetected("deadlock detected"), Problem.TIMED_OUT),
        (pgerrors.SerializationFailure("could not serialize access"), Problem.TIMED_OUT),
        (
            pgerrors.InsufficientPrivilege("permission denied for table dispatcher_jobs"),
            Problem.PERMISSION_DENIED,
        ),
        (
            pgerrors.AdminShutdown("terminating connection due to administrator command"),
            Problem.UNREACHABLE,
        ),
        (pgerrors.CannotConnectNow("the database system is starting up"), Problem.UNREACHABLE),
        (pgerrors.TooManyConnections("sorry, too many clients already"), Problem.UNREACHABLE),
        (
            pgerrors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
            Problem.UNREACHABLE,
        ),
        (pgerrors.ConnectionFailure("x"), Problem.UNREACHABLE),
        (
            psycopg.OperationalError("server closed the connection unexpectedly"),
            Problem.UNREACHABLE,
        ),
        (TimeoutError(), Problem.UNREACHABLE),
        (psycopg.ProgrammingError('invalid connection option "foo"'), Problem.BAD_SETTING),
        (pgerrors.UniqueViolation("duplicate key"), Problem.OTHER),
        (pgerrors.SyntaxError("syntax error"), Problem.OTHER),
    ],
)
def test_errors_are_classified_by_sqlstate_and_type(exc, problem):
    assert classify(exc) is problem


def test_the_text_of_a_message_plays_no_part():
    # The same words as a refused login, in a server error of another kind; and a refused login in
    # German.
    assert (
        classify(pgerrors.UniqueViolation("FATAL:  password authentication failed"))
        is Problem.OTHER
    )
    refused = ConnectError(
        Failure(
            Problem.LOGIN_REFUSED, "Passwort-Authentifizierung für Benutzer »app« fehlgeschlagen"
        ),
        "postgresql://app:s3cret@db/jobs",
    )
    assert classify(refused) is Problem.LOGIN_REFUSED
    assert "s3cret" not in str(refused) and str(refused).startswith(
        "cannot connect to app@db:5432/jobs (login refused)"
    )


@pytest.mark.parametrize("problem", list(Problem))
def test_only_what_waiting_may_fix_is_transient(problem):
    assert problem.transient is (problem in (Problem.UNREACHABLE, Problem.TIMED_OUT))


# -- our exceptions' messages: one line whatever libpq or the server said -------------------------


class FakeDiag:
    def __init__(self, primary=None, detail=None, hint=None):
        self.message_primary, self.message_detail, self.message_hint = primary, detail, hint


def test_a_server_message_with_detail_and_hint_is_one_line():
    from dispatcher.db.translate import said

    class ServerError(Exception):
        diag = FakeDiag(
            "deadlock detected",
            "Process 101 waits for ShareLock on transaction 7; blocked by process 102.\n"
            "Process 102 waits for ShareLock on transaction 8; blocked by process 101.",
            "See server log for query details.",
        )

    assert said(ServerError()) == (
        "deadlock detected; DETAIL: Process 101 waits for ShareLock on transaction 7; blocked by "
        "process 102.; Process 102 waits for ShareLock on transaction 8; blocked by process 101.; "
        "HINT: See server log for query details."
    )


def test_a_long_detail_is_cut_and_a_password_in_one_is_not_shown():
    from dispatcher.db.translate import DETAIL_CHARS, said

    class ServerError(Exception):
        diag = FakeDiag("new row violates check constraint", "Failing row contains " + "x" * 5000)

    text = said(ServerError())
    assert "\n" not in text and text.endswith("…")
    assert len(text) == len("new row violates check constraint; DETAIL: ") + DETAIL_CHARS
    dsn = "postgresql://app:s3cret@db/app"

    class Quoting(Exception):
        diag = FakeDiag("could not connect", "Tried postgresql://app:s3cret@db/app\nas app")

    assert (
        said(Quoting(), dsn)
        == "could not connect; DETAIL: Tried postgresql://app:***@db/app as app"
    )


def test_libpqs_own_three_line_text_is_one_line_in_our_exception():
    from dispatcher.db.translate import store_error
    from dispatcher.errors import StoreUnavailable

    lost = psycopg.OperationalError(
        "consuming input failed: server closed the connection unexpectedly\n"
        "\tThis probably means the server terminated abnormally\n"
        "\tbefore or while processing the request.\n"
    )
    error = store_error(lost, "claim")
    assert isinstance(error, StoreUnavailable)
    assert str(error) == (
        "claim: database unavailable: consuming input failed: server closed the connection "
        "unexpectedly; This probably means the server terminated abnormally before or while "
        "processing the request."
    )
