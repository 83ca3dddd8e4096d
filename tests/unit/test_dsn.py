"""Connection strings in messages: which server, never the password, whatever libpq echoes."""

import psycopg
import pytest

from coordinator.pg.dsn import (
    describe_dsn,
    dsn_problem,
    one_line,
    password_forms,
    redact,
    redis_url_problem,
    scrub,
)


def libpq_message(dsn: str) -> str:
    """What libpq itself says about a DSN it cannot parse: the text that used to reach users."""
    with pytest.raises(psycopg.ProgrammingError) as info:
        psycopg.conninfo.conninfo_to_dict(dsn)
    return str(info.value)


@pytest.mark.parametrize(
    "dsn, secret",
    [
        ("postgresql://u:s3cr%t@127.0.0.1:1/db", "s3cr"),  # the bad escape is in the password
        ("postgresql://u:s3cret@[::1/db", "s3cret"),  # libpq quotes the whole URI
        ("postgresql://u@h/db?password=s3cr%zz", "s3cr"),
    ],
)
def test_libpq_messages_about_a_bad_dsn_are_redacted(dsn, secret):
    raw = libpq_message(dsn)
    assert secret in raw  # what libpq says on its own: the test would catch a leak
    problem = dsn_problem(dsn)
    assert problem is not None and secret not in problem and "***" in problem


def test_every_spelling_of_the_password_is_blanked():
    dsn = "postgresql://app:p%40ss%2Fw0rd@db/jobs"
    text = 'raw "p%40ss%2Fw0rd", decoded "p@ss/w0rd"'
    assert redact(text, dsn) == 'raw "***", decoded "***"'
    assert (
        redact("password=s3cret or 's3cret'", "host=db password='s3cret'") == "password=*** or ***"
    )
    assert redact("nothing to hide", None) == "nothing to hide"


def test_one_line_drops_the_connection_prefix_and_newlines():
    exc = psycopg.OperationalError(
        'connection to server at "db", port 5432 failed: FATAL:  password '
        'authentication failed for user "app"\n\tsome hint with s3cret'
    )
    assert (
        one_line(exc, "postgresql://app:s3cret@db/jobs")
        == 'password authentication failed for user "app" some hint with ***'
    )


def test_a_valid_dsn_has_no_problem():
    assert dsn_problem("postgresql://app:s3cret@db:6432/jobs") is None
    assert dsn_problem("host=db port=bar") is None  # a bad port is found when connecting
    assert describe_dsn("postgresql://u:s3cr%t@h/db") == "(unparsable DSN)"


# -- scrub: passwords in any text, whatever DSN or URL they came from ------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("postgresql://app:s3cret@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        # an unencoded @: up to the last one
        ("postgres://app:p@ss@db/jobs", "postgres://app:***@db/jobs"),
        (
            "redis://:s3cret@cache:6379/0 and rediss://user:s3cret@cache",
            "redis://:***@cache:6379/0 and rediss://user:***@cache",
        ),
        ("dsn='postgresql://a:s3cret@h/db'", "dsn='postgresql://a:***@h/db'"),
        ("host=db password=s3cret user=app", "host=db password=*** user=app"),
        ("host=db password = 's3 cr\\'et' user=app", "host=db password = *** user=app"),
        (
            "postgresql://app@db/jobs?sslmode=require&password=s3cret&x=1",
            "postgresql://app@db/jobs?sslmode=require&password=***&x=1",
        ),
        ("{'user': 'app', 'password': 's3cret'}", "{'user': 'app', 'password': ***}"),
        ('{"PASSWORD":"s3cret"}', '{"PASSWORD":***}'),
        ("pwd: s3cret, passwd=s3cret", "pwd: ***, passwd=***"),
    ],
)
def test_scrub_blanks_every_password_it_can_see(text, expected):
    assert scrub(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        'FATAL:  password authentication failed for user "app"',
        "postgresql://db:5432/jobs",
        "redis://cache:6379/0",
        "http://example.com/a:b",
        "no password here",
    ],
)
def test_scrub_leaves_text_without_a_password_alone(text):
    assert scrub(text) == text


def test_password_forms_lists_every_spelling_longest_first():
    assert password_forms("postgresql://app:p%40ss@db/jobs") == ["p%40ss", "p@ss"]
    assert password_forms("host=db user=app") == []


@pytest.mark.parametrize(
    "url", ["redis://:s3cr3t@127.0.0.1:notaport/0", "redis//:s3cr3t@h", "http://:s3cr3t@h"]
)
def test_a_bad_redis_url_is_explained_without_its_password(url):
    problem = redis_url_problem(url)
    assert problem and "s3cr3t" not in problem


def test_a_good_redis_url_has_no_problem():
    assert redis_url_problem("redis://:s3cr3t@cache:6379/0") is None
    assert redis_url_problem("unix:///run/redis.sock") is None
