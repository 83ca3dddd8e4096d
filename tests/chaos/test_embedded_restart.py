"""EmbeddedPostgres restarts on the same port and data dir: what the server-restart tests stand
on."""

from __future__ import annotations

import socket

import psycopg
import pytest

from dispatcher.devtools.embedded import EmbeddedServerError

pytestmark = pytest.mark.chaos


def test_restart_fast_and_immediate_keep_port_and_data(restartable_pg):
    server = restartable_pg.server
    port = server.port
    with psycopg.connect(restartable_pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
    for mode in ("fast", "immediate"):
        old_pid = server.pid
        conn = psycopg.connect(restartable_pg.dsn, autocommit=True)
        try:
            server.restart(mode)
            assert server.port == port and server.pid != old_pid
            # the old session died with the old server
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        finally:
            conn.close()
        with psycopg.connect(restartable_pg.dsn, autocommit=True) as fresh:
            assert fresh.execute("SELECT n FROM kept").fetchall() == [(1,)], (
                f"data lost by a {mode} restart"
            )


def test_stop_server_keeps_it_down_until_start_again(restartable_pg):
    server = restartable_pg.server
    server.stop_server("immediate")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(restartable_pg.dsn, connect_timeout=2)
    with pytest.raises(ValueError, match="mode"):
        server.stop_server("gentle")
    with socket.socket() as squatter:  # the port was taken meanwhile: refuse, and say so
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", server.port))
        squatter.listen()
        with pytest.raises(EmbeddedServerError, match="taken"):
            server.start_again()
    server.start_again()
    with pytest.raises(EmbeddedServerError, match="still running"):
        server.start_again()
    with psycopg.connect(restartable_pg.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM dispatcher_jobs").fetchone() == (0,)
