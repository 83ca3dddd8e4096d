"""Connection strings in messages: which server, never the password, whatever libpq echoes."""

import psycopg
import pytest

from dispatcher.dsn import describe_dsn, dsn_problem, one_line, redact


def libpq_message(dsn: str) -> str:
    """What libpq itself says about a DSN it cannot parse: the text that used to reach users."""
    with pytest.raises(psycopg.ProgrammingError) as info:
        psycopg.conninfo.conninfo_to_dict(dsn)
    return str(info.value)


@pytest.mark.parametrize("dsn, secret", [
    ("postgresql://u:s3cr%t@127.0.0.1:1/db", "s3cr"),  # the bad escape is in the password
    ("postgresql://u:s3cret@[::1/db", "s3cret"),  # libpq quotes the whole URI
    ("postgresql://u@h/db?password=s3cr%zz", "s3cr"),
])
def test_libpq_messages_about_a_bad_dsn_are_redacted(dsn, secret):
    raw = libpq_message(dsn)
    assert secret in raw  # what libpq says on its own: the test would catch a leak
    problem = dsn_problem(dsn)
    assert problem is not None and secret not in problem and "***" in problem


def test_every_spelling_of_the_password_is_blanked():
    dsn = "postgresql://app:p%40ss%2Fw0rd@db/jobs"
    text = 'raw "p%40ss%2Fw0rd", decoded "p@ss/w0rd"'
    assert redact(text, dsn) == 'raw "***", decoded "***"'
    assert redact("password=s3cret or 's3cret'", "host=db password='s3cret'") == "password=*** or ***"
    assert redact("nothing to hide", None) == "nothing to hide"


def test_one_line_drops_the_connection_prefix_and_newlines():
    exc = psycopg.OperationalError('connection to server at "db", port 5432 failed: FATAL:  password '
                                   'authentication failed for user "app"\n\tsome hint with s3cret')
    assert one_line(exc, "postgresql://app:s3cret@db/jobs") == \
        'password authentication failed for user "app" some hint with ***'


def test_a_valid_dsn_has_no_problem():
    assert dsn_problem("postgresql://app:s3cret@db:6432/jobs") is None
    assert dsn_problem("host=db port=bar") is None  # a bad port is found when connecting
    assert describe_dsn("postgresql://u:s3cr%t@h/db") == "(unparsable DSN)"
