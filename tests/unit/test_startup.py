"""Start-up lines name the server without its password (what is fatal:
tests/unit/test_pg_errors.py)."""

import pytest

from dispatcher.serve.startup import describe_dsn


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://app:s3cret@db.internal:6432/jobs", "app@db.internal:6432/jobs"),
        ("host=db user=app password=s3cret dbname=jobs", "app@db:5432/jobs"),
        ("postgresql:///jobs", "localhost:5432/jobs"),
    ],
)
def test_a_dsn_is_described_without_its_password(dsn, shown):
    assert describe_dsn(dsn) == shown and "s3cret" not in describe_dsn(dsn)
