"""The fault-injection proxy, proven with real PostgreSQL connections through it."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import psycopg
import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.chaos

# How long a silence counts as "no answer": a local round trip takes ~0.1 ms, so 1 s of silence
# is four orders of magnitude past a normal reply, even on a loaded machine.
SILENCE_S = 1.0


def test_forward_passes_queries_and_the_dsn_points_at_the_proxy(chaos_dsn, proxy_to):
    proxy = proxy_to(chaos_dsn)
    via = proxy.dsn_via(chaos_dsn)
    params = psycopg.conninfo.conninfo_to_dict(via)
    assert (params["host"], params["port"]) == ("127.0.0.1", str(proxy.port))
    assert params["dbname"] == psycopg.conninfo.conninfo_to_dict(chaos_dsn)["dbname"]
    with psycopg.connect(via, autocommit=True) as conn:
        assert conn.execute("SELECT 40 + 2").fetchone() == (42,)
        # Big enough to fill socket buffers several times over: back-pressure, then all of it.
        assert conn.execute("SELECT length(repeat('x', 8000000))").fetchone() == (8_000_000,)
        assert len(conn.execute("SELECT repeat('y', 8000000)").fetchone()[0]) == 8_000_000
        assert conn.execute("SELECT inet_server_port()").fetchone()[0] == proxy.target[1]
    wait_until(lambda: proxy.connections == 0, 5, "the closed connection to leave the proxy")


def test_blackhole_holds_a_query_unanswered_then_forward_delivers_it(chaos_dsn, proxy_to):
    proxy = proxy_to(chaos_dsn)
    with (
        psycopg.connect(proxy.dsn_via(chaos_dsn), autocommit=True) as conn,
        ThreadPoolExecutor(1) as pool,
    ):
        proxy.blackhole()
        answer: Future[tuple[int] | None] = pool.submit(lambda: conn.execute("SELECT 7").fetchone())
        # the client-side timeout: no answer, and no error either
        with pytest.raises(FutureTimeout):
            answer.result(timeout=SILENCE_S)
        proxy.forward()
        assert answer.result(timeout=10) == (7,), "the query sent during the partition was lost"
        assert conn.execute("SELECT 8").fetchone() == (8,), "the same connection does not work on"


def test_blackhole_gives_no_fin_and_holds_new_connections(chaos_dsn, proxy_to):
    proxy = proxy_to(chaos_dsn)
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=SILENCE_S)
    try:
        proxy.blackhole()
        # SSLRequest: the server answers b"N" or b"S"
        raw.sendall(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")
        # b"" here would be a FIN, an exception other than a timeout an RST
        with pytest.raises(TimeoutError):
            raw.recv(1)
        # A new client's connect completes (the proxy accepts) but its start-up gets no answer.
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(proxy.dsn_via(chaos_dsn), connect_timeout=2)
        proxy.forward()
        raw.settimeout(10)
        assert raw.recv(1) in (b"N", b"S"), "the bytes sent during the partition were not delivered"
    finally:
        raw.close()


def test_reset_breaks_current_connections_with_rst_and_new_ones_work(chaos_dsn, proxy_to):
    proxy = proxy_to(chaos_dsn)
    via = proxy.dsn_via(chaos_dsn)
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    conn = psycopg.connect(via, autocommit=True)
    try:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        wait_until(lambda: proxy.connections == 2, 5, "both connections through the proxy")
        proxy.reset()
        assert proxy.connections == 0
        with pytest.raises(ConnectionResetError):  # an RST, not a FIN (which would read as b"")
            raw.recv(1)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        with psycopg.connect(via, autocommit=True) as fresh:
            assert fresh.execute("SELECT 1").fetchone() == (1,)
        # The server saw its side reset too: the old backend goes away.
        wait_until(lambda: not _backend_alive(chaos_dsn, backend), 10, f"backend {backend} to exit")
    finally:
        conn.close()
        raw.close()


def test_close_ends_the_thread_and_refuses_new_connections(chaos_dsn, proxy_to):
    proxy = proxy_to(chaos_dsn)
    with psycopg.connect(proxy.dsn_via(chaos_dsn), autocommit=True) as conn:
        proxy.close()
        assert not any(t.name == f"chaos-proxy-{proxy.port}" for t in threading.enumerate())
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
    proxy.close()  # idempotent


def _backend_alive(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return (
            conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[
                0
            ]
            > 0
        )
