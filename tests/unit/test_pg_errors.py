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
