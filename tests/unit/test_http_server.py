"""The worker's HTTP server in this process (no database): routes, and bounds on what clients can
hold (dispatcher/serve/http_server.py). The real workers' answers:
tests/integration/test_health_http.py."""

import socket
import time
import urllib.request

import orjson
import pytest

from dispatcher.errors import DispatcherError
from dispatcher.serve import http_server
from dispatcher.serve.health import Health
from tests.helpers import http_get, wait_until


@pytest.fixture
def server():
    health = Health(loop_stall_s=10)
    srv = http_server.HealthServer(0, health)
    srv.start()
    try:
        yield srv, health
    finally:
        srv.stop()


def test_routes_answer_json_or_the_metrics_page_and_unknown_paths_404(server):
    srv, health = server
    assert http_get(srv.port, "/livez") == (
        200,
        orjson.dumps({"status": "ok", "loop_heartbeat_age_s": None}),
    )
    code, body = http_get(srv.port, "/readyz")
    assert code == 503 and orjson.loads(body)["checks"]["worker"] == "starting"
    code, body = http_get(srv.port, "/metrics?x=1")  # a query string does not change the route
    assert code == 200 and b"# TYPE dispatcher_ready gauge" in body
    code, body = http_get(srv.port, "/healthz")
    assert code == 404 and orjson.loads(body) == {
        "status": "not found",
        "path": "/healthz",
        "endpoints": ["/metrics", "/livez", "/readyz"],
    }
    request = urllib.request.Request(f"http://127.0.0.1:{srv.port}/livez", method="HEAD")
    with urllib.request.urlopen(request, timeout=2) as response:
        assert (
            response.status == 200
            and response.read() == b""
            and response.headers["Content-Type"] == "application/json"
        )
    health._beat = time.monotonic() - 11
    assert http_get(srv.port, "/livez")[0] == 503


def test_ipv6_and_ipv4_clients_are_served(server):
    srv, _ = server
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            conn = socket.create_connection((host, srv.port), timeout=2)
        except OSError as exc:
            assert family == socket.AF_INET6, exc  # a host without IPv6 loopback: IPv4 must work
            continue
        with conn:
            conn.sendall(b"GET /livez HTTP/1.0\r\n\r\n")
            assert conn.recv(100).startswith(b"HTTP/1.0 200")


def test_idle_clients_hold_a_bounded_number_of_threads_for_a_bounded_time(server, monkeypatch):
    monkeypatch.setattr(http_server._Handler, "timeout", 1.0)
    srv, _ = server
    idle = [
        socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        for _ in range(http_server.MAX_CONCURRENT)
    ]
    try:
        # Every slot is held by a client that sends nothing: the next one is closed at once.
        def refused():
            with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as extra:
                extra.sendall(b"GET /livez HTTP/1.0\r\n\r\n")
                return extra.recv(100) == b""

        wait_until(refused, 5, "a request beyond the bound refused")
        # The idle ones time out after REQUEST_TIMEOUT_S (1 s here) and free their slots.
        wait_until(lambda: (a := http_get(srv.port, "/livez")) and a[0] == 200, 10, "served again")
    finally:
        for conn in idle:
            conn.close()


def test_a_taken_port_is_one_clear_error_naming_the_setting(server):
    srv, health = server
    with pytest.raises(
        DispatcherError, match=rf"port {srv.port} \(DISPATCHER_METRICS_PORT\): .*in use"
    ):
        http_server.HealthServer(srv.port, health).start()
