"""Start-up checks against a real server: fatal errors end the start at once with one clear
line; an unreachable server and (opt-in) a missing schema are waited out."""

import asyncio
import contextlib
import logging
import socket
import threading

import psycopg
import pytest

from coordinator.pg.connect import ConnectionLimits
from dispatcher.db.migrate import migrate
from dispatcher.serve.startup import StartupError, check_listen, read_schema, wait_until_ready
from tests.helpers import run_async, wait_until_async

LIMITS = ConnectionLimits(connect_timeout_s=2, statement_timeout_s=2)


def ready(dsn: str, *, wait_for_schema: bool = False, stop_after_s: float | None = None) -> bool:
    async def main():
        stopping = asyncio.Event()
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stopping.set)
        return await wait_until_ready(
            dsn, LIMITS, wait_for_schema=wait_for_schema, stopping=stopping
        )

    return run_async(main())


def test_a_current_schema_is_ready(dsn):
    assert ready(dsn) is True
    state = run_async(read_schema(dsn, LIMITS))
    assert state.missing == [] and state.newer == []


def test_no_schema_is_fatal_and_names_the_command(empty_dsn):
    with pytest.raises(
        StartupError, match=r"no dispatcher schema in .*: run `dispatcher migrate` first"
    ):
        ready(empty_dsn)


def test_an_older_schema_is_fatal_and_names_the_missing_migrations(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM dispatcher_schema_version WHERE version = "
            "(SELECT max(version) FROM dispatcher_schema_version)"
        )
    with pytest.raises(
        StartupError, match=r"schema is older than this worker \(migrations \[\d+\] not applied\)"
    ):
        ready(dsn)


def test_wait_for_schema_waits_for_the_migration_then_starts(empty_dsn, caplog):
    async def main():
        stopping = asyncio.Event()
        waiting = asyncio.create_task(
            wait_until_ready(empty_dsn, LIMITS, wait_for_schema=True, stopping=stopping)
        )
        await wait_until_async(
            lambda: "waiting for `dispatcher migrate`" in caplog.text, 10, "the wait is logged"
        )
        assert not waiting.done()
        await asyncio.to_thread(migrate, empty_dsn)
        return await asyncio.wait_for(waiting, 15)

    with caplog.at_level(logging.WARNING, logger="dispatcher.serve.startup"):
        assert run_async(main()) is True


def test_a_login_the_server_refuses_is_fatal_in_one_line_without_the_password(dsn):
    bad = psycopg.conninfo.make_conninfo(dsn, user="no_such_role", password="s3cret")
    with pytest.raises(StartupError) as info:
        ready(bad)
    message = str(info.value)
    assert (
        message.startswith("cannot log in to no_such_role@")
        and 'role "no_such_role" does not exist' in message
    )
    assert "\n" not in message and "s3cret" not in message


def test_an_unreachable_server_is_retried_with_a_line_each_time_until_stopped(caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: connections are refused
    with caplog.at_level(logging.WARNING, logger="dispatcher.serve.startup"):
        assert ready(f"postgresql://app:s3cret@127.0.0.1:{port}/jobs", stop_after_s=2.0) is False
    lines = [r.getMessage() for r in caplog.records if "unreachable at start" in r.getMessage()]
    assert len(lines) >= 2, lines
    assert all(f"app@127.0.0.1:{port}/jobs" in line and "s3cret" not in line for line in lines)


def test_an_unreachable_server_that_comes_up_is_joined(dsn):
    """A proxy port that refuses at first and forwards later: the wait ends when it answers."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=port)

    def forward_later():
        listener.listen(8)  # from now on we accept and forward
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(
                (info.get("host") or "127.0.0.1", int(info.get("port") or 5432))
            )
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    async def main():
        stopping = asyncio.Event()
        waiting = asyncio.create_task(
            wait_until_ready(via, LIMITS, wait_for_schema=False, stopping=stopping)
        )
        await asyncio.sleep(1.0)  # refused meanwhile (nothing listens on the port yet)
        assert not waiting.done()
        threading.Thread(target=forward_later, daemon=True).start()
        return await asyncio.wait_for(waiting, 20)

    try:
        assert run_async(main()) is True
    finally:
        listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def test_a_listen_dsn_the_server_refuses_is_fatal_and_named(dsn):
    bad = psycopg.conninfo.make_conninfo(dsn, user="no_such_listener", password="s3cret")
    with pytest.raises(StartupError) as info:
        run_async(check_listen(bad, LIMITS))
    message = str(info.value)
    assert (
        "(DISPATCHER_LISTEN_DSN)" in message and 'role "no_such_listener" does not exist' in message
    )
    assert "s3cret" not in message
    run_async(check_listen(dsn, LIMITS))  # a good one passes
