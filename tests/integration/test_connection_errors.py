"""One classification of what goes wrong with PostgreSQL (coordinator/pg/errors.py), against a real
server: each class of connect failure, and what each command does with it. The one-shot commands
run as real processes and fail in bounded time with one line: on a locked table, on a missing
schema, on a login or setting that cannot work. `dispatcher run` waits out only an unreachable
server. (The embedded server runs without SSL.)"""

import asyncio
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from coordinator.pg.connect import ConnectionLimits, connect, connect_sync
from coordinator.pg.errors import ConnectError, Problem
from dispatcher.db.oneshot import bounded_transaction, session
from dispatcher.errors import StoreTimeout
from dispatcher.serve.startup import StartupError, wait_until_ready
from tests.helpers import ROOT, run_async
from tests.integration.test_cli_errors import cli, closed_port, jobs, one_line_error

LIMITS = ConnectionLimits(connect_timeout_s=2, statement_timeout_s=2)
mk = psycopg.conninfo.make_conninfo


def problem_of(dsn: str) -> ConnectError:
    """The ConnectError of a sync and of an async connect, which must agree."""
    with pytest.raises(ConnectError) as sync_info:
        connect_sync(dsn, LIMITS, application_name="errors-test").close()
    with pytest.raises(ConnectError) as async_info:
        run_async(connect(dsn, LIMITS, application_name="errors-test"))
    assert sync_info.value.failure.problem is async_info.value.failure.problem
    return sync_info.value


@pytest.mark.parametrize(
    ("change", "problem", "said"),
    [
        ({"user": "no_such_role"}, Problem.LOGIN_REFUSED, 'role "no_such_role" does not exist'),
        ({"dbname": "no_such_db"}, Problem.LOGIN_REFUSED, 'database "no_such_db" does not exist'),
        (
            {"sslmode": "require"},
            Problem.BAD_SETTING,
            "sslmode=require but the server does not offer SSL",
        ),
        (
            {"sslmode": "verify-full"},
            Problem.BAD_SETTING,
            "sslmode=verify-full but the server does not offer SSL",
        ),
        ({"sslmode": "bogus"}, Problem.BAD_SETTING, "sslmode"),
        ({"target_session_attrs": "bogus"}, Problem.BAD_SETTING, "target_session_attrs"),
        ({"host": "no-such-host.invalid"}, Problem.UNREACHABLE, "no-such-host.invalid"),
    ],
)
def test_each_connect_failure_is_classified_without_reading_its_text(dsn, change, problem, said):
    error = problem_of(mk(dsn, password="s3cret", **change))
    assert error.failure.problem is problem
    assert said in str(error) and "s3cret" not in str(error) and "\n" not in str(error)


def test_a_refused_port_is_unreachable():
    assert (
        problem_of(f"postgresql://app@127.0.0.1:{closed_port()}/jobs").failure.problem
        is Problem.UNREACHABLE
    )


def test_an_unknown_connection_option_is_a_bad_setting(dsn):
    assert problem_of(dsn + " no_such_option=1").failure.problem is Problem.BAD_SETTING
    assert problem_of(mk(dsn, port="54x")).failure.problem is Problem.BAD_SETTING


def test_a_database_closed_to_connections_for_now_is_unreachable_not_refusing(pg_admin_dsn, dsn):
    """ALTER DATABASE ... ALLOW_CONNECTIONS false (maintenance): 55000 at login, waited out."""
    name = psycopg.sql.Identifier(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(name)
        )
        try:
            error = problem_of(dsn)
        finally:
            admin.execute(
                psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(name)
            )
    assert error.failure.problem is Problem.UNREACHABLE and error.failure.sqlstate == "55000", error


def test_a_refused_login_carries_the_servers_sqlstate_when_the_probe_can_read_it(dsn):
    assert problem_of(mk(dsn, user="no_such_role")).failure.sqlstate == "28000"
    assert problem_of(mk(dsn, dbname="no_such_db")).failure.sqlstate == "3D000"


def test_a_server_that_is_full_is_unreachable_not_refusing():
    """53300 (too many clients) arrives before authentication: the probe reads it, so a full
    server is waited out like an unreachable one. A small server of its own, filled up."""
    from dispatcher.devtools.embedded import start_postgres

    server = start_postgres(durable=False, max_connections=6)
    held = []
    try:
        while len(held) < 20:
            try:
                held.append(psycopg.connect(server.dsn, autocommit=True))
            except psycopg.OperationalError:
                break
        error = problem_of(server.dsn)
    finally:
        for conn in held:
            conn.close()
        server.stop()
    assert error.failure.problem is Problem.UNREACHABLE, error
    assert error.failure.sqlstate == "53300"


# -- one-shot commands as real processes -----------------------------------------------------------

ONE_SHOT = [
    ["status"],
    ["enqueue", "hello"],
    ["enqueue", "hello", "--count", "3"],
    ["jobs", "list"],
]


def timed_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    result = cli(*args)
    return result, time.monotonic() - began


@pytest.mark.parametrize("command", ONE_SHOT, ids=" ".join)
def test_a_one_shot_command_on_a_locked_table_gives_up_in_one_line(dsn, command):
    locked, release = threading.Event(), threading.Event()

    def hold():  # a migration, or a long transaction, holding the jobs table
        with psycopg.connect(dsn) as conn:
            conn.execute("LOCK TABLE dispatcher_jobs IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10)
    try:
        result, took = timed_cli(*command, "--dsn", dsn)
    finally:
        release.set()
        holder.join(10)
    line = one_line_error(
        result,
        1,
        "gave up after 5 s waiting for a lock on dispatcher_jobs (lock_timeout)",
        "is a migration or a long transaction holding it?",
    )
    assert line.startswith(f"dispatcher: {command[0]}")
    assert took < 15, f"took {took:.1f} s"
    assert jobs(dsn) == 0


@pytest.mark.parametrize("command", ONE_SHOT, ids=" ".join)
def test_a_one_shot_command_before_migrate_says_to_migrate(empty_dsn, command):
    result, _ = timed_cli(*command, "--dsn", empty_dsn)
    one_line_error(result, 1, "run `dispatcher migrate`")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"sslmode": "require"},
            "(bad connection setting): sslmode=require but the server does not offer SSL",
        ),
        ({"sslmode": "bogus"}, "(bad connection setting)"),
        ({"user": "no_such_role"}, "(login refused)"),
    ],
)
@pytest.mark.parametrize(
    "command", [["status"], ["jobs", "list"], ["enqueue", "hello"], ["migrate"]], ids=" ".join
)
def test_a_one_shot_command_fails_fast_on_a_connection_that_cannot_work(dsn, command, change, said):
    result, took = timed_cli(*command, "--dsn", mk(dsn, password="s3cret", **change))
    line = one_line_error(result, 1, said)
    assert "unreachable" not in line and "s3cret" not in line
    assert took < 10


def test_a_slow_statement_of_a_one_shot_session_ends_at_its_statement_timeout(dsn):
    limits = ConnectionLimits(statement_timeout_s=0.2)
    began = time.monotonic()
    with session(dsn, limits, application_name="errors-test") as conn:
        with (
            pytest.raises(
                StoreTimeout, match=r"^slow: gave up after 0.4 s \(statement_timeout\)$"
            ) as info,
            bounded_transaction(conn, "slow", limits, budget=2),
        ):
            conn.execute("SELECT pg_sleep(30)")
        assert info.value.lock is False
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
    assert time.monotonic() - began < 5


# -- the worker: only an unreachable server is waited out ------------------------------------------


def ready(dsn: str, stop_after_s: float) -> bool:
    async def main():
        stopping = asyncio.Event()
        asyncio.get_running_loop().call_later(stop_after_s, stopping.set)
        return await wait_until_ready(dsn, LIMITS, wait_for_schema=False, stopping=stopping)

    return run_async(main())


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"sslmode": "require"}, "sslmode=require but the server does not offer SSL"),
        ({"sslmode": "bogus"}, "sslmode"),
    ],
)
def test_the_worker_does_not_retry_a_setting_the_server_cannot_meet(dsn, change, said):
    began = time.monotonic()
    with pytest.raises(StartupError, match="bad connection setting") as info:
        ready(mk(dsn, **change), stop_after_s=30)
    assert said in str(info.value) and time.monotonic() - began < 5


def test_dispatcher_run_exits_at_once_on_a_setting_the_server_cannot_meet(dsn):
    began = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher",
            "run",
            "--app",
            "tests.apps.recording:registry",
            "--dsn",
            mk(dsn, sslmode="require"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0, result.stderr
    assert "sslmode=require but the server does not offer SSL" in result.stderr
    assert "unreachable" not in result.stderr and time.monotonic() - began < 20
