"""A TCP proxy for fault injection between workers and PostgreSQL (or Redis).

Modelled on the idea of psycopg's tests/fix_proxy.py, self-contained: one background thread runs
a `selectors` loop over non-blocking sockets. The mode can be switched at any time from the test's
thread, and applies to connections already open as well as new ones:

- `forward()` (the default): bytes flow both ways.
- `blackhole()`: a network partition. Nothing is forwarded either way, and every socket stays
  open: no FIN, no RST, so each side waits for an answer that never comes. New connections are
  accepted and held without connecting upstream, so a client's connect and start-up get no
  answer either. The proxy simply stops reading its sockets: TCP flow control holds what the
  peers send, and what the proxy had already read stays in its buffers, so nothing is lost when
  `forward()` resumes.
- `reset()`: every current connection is closed with an RST on both sides (SO_LINGER on with a
  0 s timeout), as a crashed middlebox or a conntrack flush would; new ones are forwarded again.

Each switch returns once the loop has applied it: after `blackhole()` returns, no further byte
is forwarded; after `reset()` returns, every RST has been sent.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import psycopg

_READ_CHUNK_BYTES = 65536
_BUFFER_LIMIT_BYTES = 1 << 20  # stop reading a side while 1 MiB waits for the other: back-pressure
_COMMAND_TIMEOUT_S = 10.0  # a command the loop has not applied by then means the loop is stuck
_RST_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN

FORWARD, BLACKHOLE = "forward", "blackhole"


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream twin."""

    client: socket.socket
    server: socket.socket | None = None  # None until connected upstream (held while black-holed)
    connecting: bool = False
    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    client_eof: bool = False  # the client sent FIN
    server_eof: bool = False
    server_shut: bool = False  # we passed the client's FIN on
    client_shut: bool = False

    def sockets(self) -> list[socket.socket]:
        return [self.client] if self.server is None else [self.client, self.server]


class ProxyError(RuntimeError):
    pass


class Proxy:
    """Listens on 127.0.0.1:<free port> and forwards to `target_host:target_port`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._commands: queue.SimpleQueue[tuple[str, threading.Event]] = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._interest: dict[socket.socket, int] = {}
        self._links: list[_Link] = []
        self._mode = FORWARD  # written by the loop thread only
        self._failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"chaos-proxy-{self.port}", daemon=True
        )
        self._thread.start()

    # -- the test's side ---------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def connections(self) -> int:
        """Client connections open through the proxy (held ones included)."""
        return len(self._links)

    def dsn_via(self, dsn: str) -> str:
        """`dsn` rewritten to connect through this proxy."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo("", **params)

    def forward(self) -> None:
        self._command(FORWARD)

    def blackhole(self) -> None:
        self._command(BLACKHOLE)

    def reset(self) -> None:
        self._command("reset")

    def close(self) -> None:
        """Stop the thread and close every socket (with RST). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._send("close")
        self._thread.join(_COMMAND_TIMEOUT_S)
        for sock in (self._wake_r, self._wake_w, self._listener):
            sock.close()
        self._selector.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _command(self, name: str) -> None:
        if self._closed:
            raise ProxyError(f"proxy on port {self.port} is closed")
        self._send(name)

    def _send(self, name: str) -> None:
        done = threading.Event()
        self._commands.put((name, done))
        # A full wake-up pipe: the loop has wake-ups pending anyway.
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"\0")
        if not done.wait(_COMMAND_TIMEOUT_S):
            raise ProxyError(
                f"proxy loop did not apply {name!r} within {_COMMAND_TIMEOUT_S} s "
                f"(alive={self._thread.is_alive()}, failure={self._failure!r})"
            )

    # -- the loop thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._sync_interest()
                for key, events in self._selector.select():
                    if key.fileobj is self._wake_r:
                        if not self._run_commands():
                            return
                    elif key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._service(key.data, key.fileobj, events)  # type: ignore[arg-type]
        except BaseException as exc:  # kept for the next command's error message
            self._failure = exc
            raise
        finally:
            for link in list(self._links):
                self._abort(link)
            while not self._commands.empty():  # nobody must wait for a loop that is gone
                self._commands.get()[1].set()

    def _run_commands(self) -> bool:
        while True:
            try:
                self._wake_r.recv(4096)
            except BlockingIOError:
                break
        while not self._commands.empty():
            name, done = self._commands.get()
            if name == "close":
                done.set()
                return False
            if name == "reset":
                for link in list(self._links):
                    self._abort(link)
                self._mode = FORWARD
            else:
                self._mode = name
            done.set()
        return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._links.append(_Link(client))

    def _connect_upstream(self, link: _Link) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setblocking(False)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.server, link.connecting = server, True
        code = server.connect_ex(self.target)
        if code not in (0, errno.EINPROGRESS):
            self._abort(link)  # the target refuses: so does the proxy, as abruptly

    def _sync_interest(self) -> None:
        """(Re)register each socket for what it may do in the current mode."""
        wanted: dict[socket.socket, tuple[int, _Link | None]] = {
            self._wake_r: (selectors.EVENT_READ, None),
            self._listener: (selectors.EVENT_READ, None),
        }
        if self._mode == FORWARD:
            for link in list(self._links):
                if link.server is None:
                    self._connect_upstream(link)
                    if link not in self._links:
                        continue
                assert link.server is not None
                if link.connecting:
                    wanted[link.server] = (selectors.EVENT_WRITE, link)
                    continue
                client_ev = server_ev = 0
                if not link.client_eof and len(link.to_server) < _BUFFER_LIMIT_BYTES:
                    client_ev |= selectors.EVENT_READ
                if not link.server_eof and len(link.to_client) < _BUFFER_LIMIT_BYTES:
                    server_ev |= selectors.EVENT_READ
                if link.to_client:
                    client_ev |= selectors.EVENT_WRITE
                if link.to_server:
                    server_ev |= selectors.EVENT_WRITE
                if client_ev:
                    wanted[link.client] = (client_ev, link)
                if server_ev:
                    wanted[link.server] = (server_ev, link)
        for sock in [s for s in self._interest if s not in wanted]:
            self._selector.unregister(sock)
            del self._interest[sock]
        for sock, (events, link) in wanted.items():
            if sock not in self._interest:
                self._selector.register(sock, events, link)
            elif self._interest[sock] != events:
                self._selector.modify(sock, events, link)
            self._interest[sock] = events

    def _service(self, link: _Link, sock: socket.socket, events: int) -> None:
        if link not in self._links:
            return  # aborted earlier in this round
        try:
            if link.connecting:
                assert link.server is not None
                code = link.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise ConnectionRefusedError(code, errno.errorcode.get(code, "?"))
                link.connecting = False
                return
            from_client = sock is link.client
            if events & selectors.EVENT_READ:
                data = sock.recv(_READ_CHUNK_BYTES)
                if not data:
                    if from_client:
                        link.client_eof = True
                    else:
                        link.server_eof = True
                (link.to_server if from_client else link.to_client).extend(data)
            if events & selectors.EVENT_WRITE:
                out = link.to_client if from_client else link.to_server
                del out[: sock.send(out)]
            self._pass_eofs(link)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._abort(link)  # one side reset or failed: the other side learns it as abruptly

    def _pass_eofs(self, link: _Link) -> None:
        """A FIN goes on once what preceded it is delivered; the link ends when both are through."""
        assert link.server is not None
        if link.client_eof and not link.to_server and not link.server_shut:
            link.server.shutdown(socket.SHUT_WR)
            link.server_shut = True
        if link.server_eof and not link.to_client and not link.client_shut:
            link.client.shutdown(socket.SHUT_WR)
            link.client_shut = True
        if link.server_shut and link.client_shut:
            self._drop(link, rst=False)

    def _abort(self, link: _Link) -> None:
        self._drop(link, rst=True)

    def _drop(self, link: _Link, *, rst: bool) -> None:
        if link in self._links:
            self._links.remove(link)
        for sock in link.sockets():
            if sock in self._interest:
                self._selector.unregister(sock)
                del self._interest[sock]
            if rst:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_ON_CLOSE)
            sock.close()
