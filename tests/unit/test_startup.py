"""Start-up error classification: what is fatal, what is waited out, and no password in a line."""

import psycopg
import pytest

from dispatcher.serve.startup import describe_dsn, login_refused


@pytest.mark.parametrize(("message", "fatal"), [
    ('connection to server at "db", port 5432 failed: FATAL:  password authentication failed for user "app"', True),
    ('connection to server at "db", port 5432 failed: FATAL:  role "app" does not exist', True),
    ('connection to server at "db", port 5432 failed: FATAL:  database "jobs" does not exist', True),
    ('connection to server at "db", port 5432 failed: FATAL:  no pg_hba.conf entry for host "10.0.0.7"', True),
    ('connection to server at "db", port 5432 failed: FATAL:  the database system is starting up', False),
    ('connection to server at "db", port 5432 failed: FATAL:  the database system is shutting down', False),
    ('connection to server at "db", port 5432 failed: FATAL:  sorry, too many clients already', False),
    ('connection to server at "db", port 5432 failed: Connection refused', False),
    ("failed to resolve host 'db.internal': [Errno -2] Name or service not known", False),
])
def test_only_a_login_the_server_refuses_is_fatal(message, fatal):
    assert login_refused(psycopg.OperationalError(message)) is fatal


@pytest.mark.parametrize(("dsn", "shown"), [
    ("postgresql://app:s3cret@db.internal:6432/jobs", "app@db.internal:6432/jobs"),
    ("host=db user=app password=s3cret dbname=jobs", "app@db:5432/jobs"),
    ("postgresql:///jobs", "localhost:5432/jobs"),
])
def test_a_dsn_is_described_without_its_password(dsn, shown):
    assert describe_dsn(dsn) == shown and "s3cret" not in describe_dsn(dsn)
