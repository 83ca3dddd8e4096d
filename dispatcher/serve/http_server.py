"""The worker's own small HTTP server on DISPATCHER_METRICS_PORT: /metrics, /livez, /readyz.

A daemon thread started before the start-up checks; bounded (MAX_CONCURRENT requests,
REQUEST_TIMEOUT_S each); unknown paths are 404; requests are not logged. It binds all interfaces,
IPv6 and IPv4: it only reads, and who may reach it is the network's decision. Why not
prometheus_client's server: docs/design/health-and-metrics.md.
"""

from __future__ import annotations

import errno
import gzip
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from dispatcher.errors import DispatcherError
from dispatcher.serve.health import Health

log = logging.getLogger(__name__)

MAX_CONCURRENT = 8
REQUEST_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 2.0
JSON = "application/json"
ENDPOINTS = ("/metrics", "/livez", "/readyz")


def exposition(
    accept: str | None, accept_encoding: str | None, query: str
) -> tuple[bytes, str, str | None]:
    """/metrics as prometheus_client's own server answers it: the format the scraper's Accept asks
    for (OpenMetrics, else the text format 0.0.4), only the families `name[]` names when given,
    gzipped when it accepts gzip. (body, content type, content encoding or None)"""
    names = parse_qs(query).get("name[]")
    encoder, content_type = choose_encoder(accept or "")
    body = encoder(REGISTRY.restricted_registry(names) if names else REGISTRY)
    if "gzip" in (accept_encoding or ""):
        return gzip.compress(body, compresslevel=6), content_type, "gzip"
    return body, content_type, None


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a request still being served never delays the process's exit
    request_queue_size = 16

    def __init__(
        self, address: tuple[str, int], family: socket.AddressFamily, health: Health
    ) -> None:
        self.address_family = family
        self.health = health
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # IPv4 too, as ::ffff:a.b.c.d
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # busy: refuse now rather than start one more thread
            return
        try:
            super().process_request(request, client_address)  # starts the request's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr for every error; a scraper or probe that hangs
        # up mid-answer (a timeout, a reset) is routine, and anything else is at least not a
        # reason to write around the log handler.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("client %s went away: %s", client_address, exc)
        else:
            log.warning("serving a request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "dispatcher"
    timeout = REQUEST_TIMEOUT_S  # socket timeout while the request is read and the answer written

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _answer(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        path = url.path
        health = self.server.health
        content_type, encoding = JSON, None
        try:
            if path == "/metrics":
                code = 200
                body, content_type, encoding = exposition(
                    self.headers.get("Accept"), self.headers.get("Accept-Encoding"), url.query
                )
            elif path == "/livez":
                code, payload = health.livez()
                body = orjson.dumps(payload)
            elif path == "/readyz":
                code, payload = health.readyz()
                body = orjson.dumps(payload)
            else:
                code, body = (
                    404,
                    orjson.dumps({"status": "not found", "path": path, "endpoints": ENDPOINTS}),
                )
        except Exception as exc:
            log.exception("serving %s failed", path)
            code, body, content_type, encoding = (
                500,
                orjson.dumps({"status": "error", "error": repr(exc)}),
                JSON,
                None,
            )
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class HealthServer:
    """Serves `health` and the default Prometheus registry on `port` until stop()."""

    def __init__(self, port: int, health: Health) -> None:
        self._port = port
        self._health = health
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the kernel's choice for 0 in tests)."""
        return self._server.server_address[1] if self._server is not None else self._port

    def start(self) -> None:
        errors = []
        for host, family in (("::", socket.AF_INET6), ("0.0.0.0", socket.AF_INET)):
            try:
                self._server = _Server((host, self._port), family, self._health)
                break
            except OSError as exc:  # no IPv6 here (EAFNOSUPPORT, EADDRNOTAVAIL): IPv4 only
                errors.append(exc)
                if exc.errno == errno.EADDRINUSE:
                    break
        if self._server is None:
            raise DispatcherError(
                f"cannot serve /metrics, /livez and /readyz on port {self._port} "
                f"(DISPATCHER_METRICS_PORT): {errors[-1].strerror or errors[-1]}"
            )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="dispatcher-http",
            daemon=True,
        )
        self._thread.start()
        log.info("serving /metrics, /livez and /readyz on port %d", self.port)

    def stop(self) -> None:
        """Stop accepting and close the socket; bounded (a request in flight is a daemon thread)."""
        server, self._server = self._server, None
        if server is None:
            return
        stopper = threading.Thread(target=server.shutdown, name="dispatcher-http-stop", daemon=True)
        stopper.start()
        stopper.join(STOP_TIMEOUT_S)  # serve_forever notices within its poll interval
        server.server_close()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
