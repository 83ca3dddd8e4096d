"""The CLI on bad input and on a database it cannot use: one line on stderr and an exit code,
never a traceback, never the password, nothing written.

Exit codes: 2 for anything wrong in the invocation itself (a setting, a flag, an argument,
including a payload or option that enqueue refuses), found before anything is written; 1 for
a database that refuses or cannot be reached.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import psycopg
import pytest

from dispatcher import enqueue_sync
from tests.helpers import ROOT, fetchval, start_worker, stop_workers, wait_until


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`dispatcher ARGS` in a subprocess, with no DISPATCHER_* from our environment unless given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *named: str) -> str:
    """Assert the command failed with `code` and exactly one line on stderr naming each of
    `named`."""
    lines = result.stderr.splitlines()
    assert result.returncode == code, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("dispatcher: "), result.stderr
    for name in named:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def jobs(dsn: str) -> int:
    return fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again: connections are refused


# -- enqueue: arguments that enqueue refuses -------------------------------------------------------

PAYLOAD_44_BYTES = orjson.dumps({"customer": "c-4242", "plan": "pro-annual-42"}).decode()


@pytest.mark.parametrize(
    "args, env",
    [
        (["--max-payload-bytes", "10"], {}),
        # the bulk path, limit from the environment
        (["--count", "3"], {"DISPATCHER_MAX_PAYLOAD_BYTES": "10"}),
    ],
)
def test_enqueue_refuses_a_payload_over_max_payload_bytes(dsn, args, env):
    assert len(PAYLOAD_44_BYTES) == 44
    result = cli("enqueue", "hello", "--payload", PAYLOAD_44_BYTES, "--dsn", dsn, *args, env=env)
    one_line_error(result, 2, "--payload", "44 bytes, over the limit of 10 bytes")
    assert jobs(dsn) == 0


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--delay-s", "nan"),
        ("--delay-s", "inf"),
        ("--jitter-s", "nan"),
        ("--jitter-s", "inf"),
        ("--max-attempts", "0"),
        ("--priority", "40000"),
    ],
)
@pytest.mark.parametrize("count", ["1", "4"])
def test_enqueue_refuses_a_bad_option_naming_its_flag(dsn, flag, value, count):
    result = cli("enqueue", "hello", flag, value, "--count", count, "--dsn", dsn)
    one_line_error(result, 2, flag)
    assert jobs(dsn) == 0


@pytest.mark.parametrize("count", ["-3", "0"])
def test_enqueue_count_must_be_at_least_one(dsn, count):
    one_line_error(cli("enqueue", "hello", "--count", count, "--dsn", dsn), 2, "--count", ">= 1")
    assert jobs(dsn) == 0


def test_enqueue_refuses_a_job_type_that_is_no_name(dsn):
    one_line_error(cli("enqueue", "we ird", "--dsn", dsn), 2, "job_type")
    assert jobs(dsn) == 0


# -- worker settings that used to be ignored or accepted -------------------------------------------


@pytest.mark.parametrize(
    "env, named",
    [
        # not the static coordinator: was ignored
        ({"DISPATCHER_BUCKETS": "0-15"}, "DISPATCHER_BUCKETS"),
        # no bucket
        ({"DISPATCHER_COORDINATOR": "static", "DISPATCHER_BUCKETS": ","}, "DISPATCHER_BUCKETS"),
        ({"DISPATCHER_QUEUES": "we ird"}, "DISPATCHER_QUEUES"),  # a queue no job can be enqueued to
    ],
)
def test_run_refuses_settings_it_would_ignore_or_never_serve(dsn, env, named):
    result = cli(
        "run", "--app", "tests.apps.recording:registry", env={"DISPATCHER_DSN": dsn, **env}
    )
    one_line_error(result, 2, named)


# -- a database the CLI cannot use -----------------------------------------------------------------

COMMANDS = [["enqueue", "hello"], ["status"], ["migrate"], ["jobs", "list"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_refused_connection_is_one_line_and_exit_1(command):
    port = closed_port()
    result = cli(*command, "--dsn", f"postgresql://app:s3cret@127.0.0.1:{port}/jobs")
    line = one_line_error(result, 1, f"app@127.0.0.1:{port}/jobs", "Connection refused")
    assert "s3cret" not in line


@pytest.mark.parametrize(
    "command", [*COMMANDS, ["run", "--app", "tests.apps.recording:registry"]], ids=lambda c: c[0]
)
def test_a_malformed_dsn_is_a_bad_setting_and_its_password_is_not_echoed(command):
    # libpq's own message quotes the token with the bad escape: here, the password.
    result = cli(*command, env={"DISPATCHER_DSN": "postgresql://u:s3cr%t@127.0.0.1:1/db"})
    one_line_error(result, 2, "DISPATCHER_DSN", "percent-encoded")
    assert "s3cr" not in result.stderr + result.stdout


@pytest.fixture(scope="module")
def password_server():
    """(port, role) of a private PostgreSQL where role `app` must log in with the password
    's3cr%t'. Private: pg_hba.conf is server-wide, and the session's server may be a shared
    one (DISPATCHER_TEST_DSN) that tests must not reconfigure."""
    from dispatcher.devtools.embedded import start_postgres

    with start_postgres() as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
            conn.execute("CREATE ROLE app LOGIN PASSWORD 's3cr%t'")
            hba.write_text(f"host all app 127.0.0.1/32 scram-sha-256\n{hba.read_text()}")
            conn.execute("SELECT pg_reload_conf()")

        def refuses_a_wrong_password():
            try:
                psycopg.connect(f"postgresql://app:wrong@127.0.0.1:{server.port}/postgres").close()
            except psycopg.OperationalError as exc:
                return "password authentication failed" in str(exc)
            return False

        wait_until(refuses_a_wrong_password, 10, "the server to load the new pg_hba.conf")
        yield server.port


@pytest.mark.parametrize(
    "command", [*COMMANDS, ["run", "--app", "tests.apps.recording:registry"]], ids=lambda c: c[0]
)
def test_a_wrong_password_is_one_line_and_exit_1_without_the_password(password_server, command):
    # The right password is s3cr%t, so a leak of either would show "s3cr".
    dsn = f"postgresql://app:s3cr%25tX@127.0.0.1:{password_server}/postgres"
    result = cli(*command, "--dsn", dsn)
    one_line_error(result, 1, "app@127.0.0.1", 'password authentication failed for user "app"')
    assert "s3cr" not in result.stderr + result.stdout
    # The control: with the right password the login works (so the failure above was the password).
    psycopg.connect(dsn.replace("s3cr%25tX", "s3cr%25t")).close()


# -- status --json ---------------------------------------------------------------------------------


def test_status_json_with_runnable_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for bucket in (3, 3, 40):
            enqueue_sync(conn, "hello", bucket=bucket)
        enqueue_sync(conn, "later", bucket=5, delay_s=3600)  # queued, not runnable
    result = cli("status", "--json", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    status = orjson.loads(result.stdout)
    assert status["runnable_by_bucket"] == {"3": 2, "40": 1}
    assert status["queues"]["default"]["counts"]["queued"] == 4
    assert status["queues"]["default"]["oldest_runnable_age_s"] >= 0


# -- no password in any log line, in either format -------------------------------------------------


def messages(text: str, fmt: str) -> list[str]:
    """The log's lines (in the json format each must be a JSON object with a `worker`: its msg)."""
    if fmt == "text":
        return text.splitlines()
    docs = [orjson.loads(line) for line in text.splitlines()]
    assert all("worker" in doc for doc in docs), text
    return [doc["msg"] for doc in docs]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_refused_login_logs_no_password_in_either_format(password_server, fmt):
    dsn = f"postgresql://app:s3cr%25tX@127.0.0.1:{password_server}/postgres"
    result = cli(
        "run",
        "--app",
        "tests.apps.recording:registry",
        "--log-level",
        "DEBUG",
        "--log-format",
        fmt,
        env={"DISPATCHER_DSN": dsn, "DISPATCHER_LISTEN_DSN": dsn},
    )
    assert result.returncode == 1, result.stderr
    assert "s3cr" not in result.stderr + result.stdout
    last = messages(result.stderr, fmt)[-1]
    assert (
        "cannot log in to app@127.0.0.1" in last
        and 'password authentication failed for user "app"' in last
    )
    if fmt == "json":  # the config was read: every line names the worker
        assert all(orjson.loads(line)["worker"] for line in result.stderr.splitlines())


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_redis_password_is_in_no_line_when_redis_refuses_it(dsn, redis_url, tmp_path, fmt):
    # The session's Redis has no such user, so it refuses our AUTH; the worker logs it while it
    # falls back to SKIP LOCKED, at DEBUG: as many lines as it can make.
    url = redis_url.replace("redis://", "redis://nobody:Rs3cr3t@", 1)
    log_path = tmp_path / "w.out"
    worker = start_worker(
        dsn,
        log_path=log_path,
        coordinator="redis",
        redis_url=url,
        coordinator_lease_s=3,
        log_format=fmt,
        log_level="DEBUG",
        poll_interval_s=0.2,
    )
    try:
        wait_until(
            lambda: (
                "falling back to SKIP LOCKED" in log_path.read_text() or worker.poll() is not None
            ),
            30,
            "the worker to give up on Redis for now",
        )
    finally:
        assert stop_workers([worker]) == [0], log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert "falling back to SKIP LOCKED" in text and "invalid username-password pair" in text, text[
        -3000:
    ]
    assert "Rs3cr3t" not in text
    messages(text, fmt)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_malformed_redis_url_is_a_bad_setting_without_its_password(dsn, fmt):
    result = cli(
        "run",
        "--app",
        "tests.apps.recording:registry",
        "--log-format",
        fmt,
        env={
            "DISPATCHER_DSN": dsn,
            "DISPATCHER_COORDINATOR": "redis",
            "DISPATCHER_REDIS_URL": "redis://:Rs3cr3t@127.0.0.1:notaport/0",
        },
    )
    assert result.returncode == 2, result.stderr
    [line] = messages(result.stderr, fmt)
    assert "DISPATCHER_REDIS_URL" in line and "notaport" in line and "Rs3cr3t" not in line
