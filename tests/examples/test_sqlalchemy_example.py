"""docs/examples/sqlalchemy_enqueue.py against a real PostgreSQL: the job enqueued inside a
session's transaction commits or rolls back with the session's rows."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.helpers import ROOT, fetchall, fetchval

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is in the `test` extra")
Session = pytest.importorskip("sqlalchemy.orm").Session

EXAMPLE = ROOT / "docs" / "examples" / "sqlalchemy_enqueue.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sqlalchemy_enqueue", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def engine(dsn: str, example: ModuleType) -> Iterator[Any]:
    """The psycopg 3 dialect (`postgresql+psycopg://`) on the test's database, with the example's
    table."""
    params = conninfo_to_dict(dsn)
    url = sqlalchemy.URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params["port"]) if "port" in params else None,
        database=params["dbname"],
    )
    engine = sqlalchemy.create_engine(url)
    example.Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def welcome_jobs(dsn: str) -> list[tuple[Any, ...]]:
    return fetchall(
        dsn,
        "SELECT payload->>'user_id', status FROM dispatcher_jobs WHERE job_type = 'send_welcome'",
    )


def test_the_job_commits_with_the_session(dsn: str, engine: Any, example: ModuleType) -> None:
    with Session(engine) as session, session.begin():
        user = example.sign_up(session, "ada@example.com")
        user_id = user.id
        assert welcome_jobs(dsn) == []  # written, not committed: other sessions see nothing
    assert fetchval(dsn, "SELECT email FROM users WHERE id = %s", (user_id,)) == "ada@example.com"
    assert welcome_jobs(dsn) == [(str(user_id), "queued")]


def test_a_rolled_back_session_leaves_no_job(dsn: str, engine: Any, example: ModuleType) -> None:
    with (
        pytest.raises(RuntimeError, match="no such plan"),
        Session(engine) as session,
        session.begin(),
    ):
        example.sign_up(session, "grace@example.com")
        raise RuntimeError("no such plan")
    assert fetchval(dsn, "SELECT count(*) FROM users") == 0
    assert welcome_jobs(dsn) == []
