"""Real throwaway servers from dispatcher.devtools.embedded: start, isolate, stop, and clean up
after crashes."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from dispatcher.devtools.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedServerError,
    start_postgres,
    start_redis,
)
from dispatcher.devtools.embedded.processes import alive
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]

# Started in a child interpreter that we then SIGKILL, to leave an orphan behind.
ORPHAN_SCRIPT = """
import json, sys, time
from dispatcher.devtools import embedded
from dispatcher.devtools.embedded import processes
kind, pdeathsig = sys.argv[1], sys.argv[2] == "1"
processes.USE_PDEATHSIG = pdeathsig
srv = embedded.start_postgres() if kind == "pg" else embedded.start_redis()
print(json.dumps({"pid": srv.pid, "tmpdir": str(srv.tmpdir)}), flush=True)
time.sleep(600)
"""


def pid_gone(pid: int) -> bool:
    return not alive(pid)  # a zombie counts as gone


def refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def spawn_orphan(kind: str, pdeathsig: bool) -> tuple[subprocess.Popen[str], int, Path]:
    """Run a server in a child interpreter and return (child, server pid, server dir)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT, kind, "1" if pdeathsig else "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"orphan child did not start a server:\n{err}")
    info = json.loads(line)
    return proc, int(info["pid"]), Path(info["tmpdir"])


def sigkill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate()  # reap it and close its pipes


@pytest.fixture
def pg() -> Iterator[EmbeddedPostgres]:
    with start_postgres() as server:
        yield server


@pytest.fixture
def rds() -> Iterator[EmbeddedRedis]:
    with start_redis() as server:
        yield server


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_starts_and_is_version_18(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.dsn) as conn:
        version = conn.execute("SELECT version()").fetchone()
        num = conn.execute("SHOW server_version_num").fetchone()
    assert version is not None and version[0].startswith("PostgreSQL 18")
    assert num is not None and 180000 <= int(num[0]) < 190000
    assert pg.dsn == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    assert pg.dsn_for("other").endswith(f":{pg.port}/other")
    assert pg.datadir.is_dir() and (pg.datadir / "PG_VERSION").read_text().strip() == "18"
    assert alive(pg.pid)


def test_postgres_dsn_for_created_database(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE jobs")
    with psycopg.connect(pg.dsn_for("jobs")) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row == ("jobs",)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has to drop privileges")
def test_postgres_runs_unprivileged_when_root(pg: EmbeddedPostgres) -> None:
    status = Path(f"/proc/{pg.pid}/status").read_text()
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert "0" not in uids
    assert pg.datadir.stat().st_uid == int(uids[0])


def test_two_servers_get_different_ports_and_dirs() -> None:
    with start_postgres() as a, start_postgres() as b:
        assert a.port != b.port and a.datadir != b.datadir
        for srv in (a, b):
            with psycopg.connect(srv.dsn) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
            assert row is not None and Path(row[0]).resolve() == srv.datadir


def test_stop_removes_dir_and_port_refuses() -> None:
    srv = start_postgres()
    pid, port, tmpdir = srv.pid, srv.port, srv.tmpdir
    assert tmpdir.is_dir()
    srv.stop()
    assert not tmpdir.exists()
    assert pid_gone(pid)
    assert refuses(port)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(srv.dsn, connect_timeout=2).close()
    srv.stop()  # idempotent


def test_durable_flag_controls_fsync() -> None:
    with start_postgres(durable=False) as fast, start_postgres(durable=True) as durable:
        with psycopg.connect(fast.dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
            assert conn.execute("SHOW full_page_writes").fetchone() == ("off",)
        with psycopg.connect(durable.dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            assert conn.execute("SHOW full_page_writes").fetchone() == ("on",)


def test_max_connections_and_extra_settings() -> None:
    with (
        start_postgres(max_connections=37, settings={"work_mem": "7MB", "jit": False}) as srv,
        psycopg.connect(srv.dsn) as conn,
    ):
        assert conn.execute("SHOW max_connections").fetchone() == ("37",)
        assert conn.execute("SHOW work_mem").fetchone() == ("7MB",)
        assert conn.execute("SHOW jit").fetchone() == ("off",)
        assert conn.execute("SHOW shared_buffers").fetchone() == ("128MB",)


def test_bad_setting_raises_with_log_tail() -> None:
    before = set(Path(tempfile.gettempdir()).glob("dispatcher-pg-*"))
    with pytest.raises(EmbeddedServerError, match="no_such_setting"):
        start_postgres(settings={"no_such_setting": 1})
    leaked = set(Path(tempfile.gettempdir()).glob("dispatcher-pg-*")) - before
    assert not any(
        json.loads((d / "owner.json").read_text())["pid"] == os.getpid()
        for d in leaked
        if (d / "owner.json").exists()
    )


def test_forked_child_does_not_stop_server(pg: EmbeddedPostgres) -> None:
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            pg.stop()
            pg._atexit()
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pg.datadir.is_dir() and alive(pg.pid)
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_sigkilled_owner_takes_postgres_down_and_next_start_cleans_dir() -> None:
    proc, server_pid, tmpdir = spawn_orphan("pg", pdeathsig=True)
    assert tmpdir.is_dir() and alive(server_pid)
    sigkill(proc)
    # PDEATHSIG (set after the switch to the unprivileged user) stops the postmaster.
    wait_until(lambda: pid_gone(server_pid), 15, "postmaster to die with its owner")
    assert tmpdir.is_dir()
    with start_postgres():
        assert not tmpdir.exists()


def test_leaked_postmaster_is_killed_by_next_start() -> None:
    proc, server_pid, tmpdir = spawn_orphan("pg", pdeathsig=False)
    sigkill(proc)
    assert alive(server_pid)  # nothing took it down: a genuine leak
    with start_postgres():
        wait_until(lambda: pid_gone(server_pid), 15, "leaked postmaster to be killed")
        assert not tmpdir.exists()


def test_live_owner_dir_is_left_alone(pg: EmbeddedPostgres) -> None:
    with start_postgres():
        assert pg.datadir.is_dir() and alive(pg.pid)


# --------------------------------------------------------------------------- Redis


def test_redis_ping_set_get(rds: EmbeddedRedis) -> None:
    assert rds.url == f"redis://127.0.0.1:{rds.port}/0"
    client = redis.Redis.from_url(rds.url)
    try:
        assert client.ping()
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert client.config_get("save") == {"save": ""}
    finally:
        client.close()


def test_two_redis_servers_get_different_ports() -> None:
    with start_redis() as a, start_redis() as b:
        assert a.port != b.port


def test_redis_kill_and_start_again_on_same_port(rds: EmbeddedRedis) -> None:
    port, old_pid = rds.port, rds.pid
    client = redis.Redis.from_url(rds.url, socket_timeout=2)
    try:
        client.set("k", "v")
        rds.kill()
        assert pid_gone(old_pid) and rds.tmpdir.is_dir()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        rds.start_again()
        assert rds.port == port and rds.pid != old_pid
        assert client.ping()
        assert client.get("k") is None  # no persistence
    finally:
        client.close()


def test_redis_start_again_refuses_taken_port(rds: EmbeddedRedis) -> None:
    with pytest.raises(EmbeddedServerError, match="still running"):
        rds.start_again()
    rds.kill()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", rds.port))
        squatter.listen()
        with pytest.raises(EmbeddedServerError, match="taken"):
            rds.start_again()
    rds.start_again()
    client = redis.Redis.from_url(rds.url)
    try:
        assert client.ping()
    finally:
        client.close()


def test_redis_stop_cleans_up() -> None:
    srv = start_redis()
    pid, port, tmpdir = srv.pid, srv.port, srv.tmpdir
    srv.stop()
    assert not tmpdir.exists() and pid_gone(pid) and refuses(port)
    srv.stop()


def test_server_started_from_short_lived_thread_outlives_it() -> None:
    # PDEATHSIG is per forking *thread*; the module forks from a process-long spawner thread.
    started: list[EmbeddedRedis] = []
    worker = threading.Thread(target=lambda: started.append(start_redis()))
    worker.start()
    worker.join()
    with started[0] as srv:
        client = redis.Redis.from_url(srv.url, socket_timeout=2)
        try:
            deadline = time.monotonic() + 1.0  # a killed server would be gone within ms
            while time.monotonic() < deadline:
                assert client.ping() and alive(srv.pid)
                time.sleep(0.05)
        finally:
            client.close()


def test_redis_orphan_cleaned_by_next_start() -> None:
    proc, server_pid, tmpdir = spawn_orphan("redis", pdeathsig=True)
    sigkill(proc)
    wait_until(lambda: pid_gone(server_pid), 15, "redis to die with its owner")
    with start_redis():
        assert not tmpdir.exists()


def test_leaked_redis_is_killed_by_next_start() -> None:
    proc, server_pid, tmpdir = spawn_orphan("redis", pdeathsig=False)
    sigkill(proc)
    assert alive(server_pid)
    with start_redis():
        wait_until(lambda: pid_gone(server_pid), 15, "leaked redis to be killed")
        assert not tmpdir.exists()
