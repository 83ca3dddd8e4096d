"""Waiting for notifications on a LISTEN connection without waking up ten times a second.

psycopg's `AsyncConnection.notifies(timeout=...)` waits on the socket in steps of 0.1 s (its
async wait interval, there so that a blocking wait notices Ctrl-C), so an idle LISTEN connection
costs ten event-loop wake-ups a second, each of them a timer and a reader added and removed. A
worker has one such connection (the jobs' LISTEN), and in partitioned mode a second one (its
coordinator's). Eight idle coordinators in one process spent 20-33 ms of CPU a second, 40% of it
in those wake-ups (cProfile with a CPU clock); the fleet pays it for as long as it runs,
during a drain too. Measured on worker processes: an idle partitioned worker (8 of them, default
settings, 10 s) used 7.1 ms of CPU a second before this wait and 5.1 ms after.

`NotificationWait.wait()` waits on the socket itself (`loop.add_reader`) for the whole interval
and reads what arrived through libpq (`consume_input`, `notifies`). Notifications that psycopg
reads while a statement runs on the connection (a probe's `SELECT 1`) reach the same callback
through the connection's notify handler, so none is missed and none is seen twice: each one
leaves libpq's queue once, by whichever of the two paths reads it.

Shared by both packages (the coordinator imports nothing from dispatcher), like connect.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from .sqlfile import load


def listen_statement(channel: str) -> sql.Composed:
    """LISTEN on `channel`, quoted as an identifier."""
    return sql.SQL(load("coordinator")["listen"]).format(channel=sql.Identifier(channel))


def probe_statement() -> str:
    """What a silent LISTEN connection asks, so that a stall on it shows."""
    return load("coordinator")["listen_probe"]


class NotificationWait:
    """Deliver the notifications of `conn` (which has run its LISTEN) to `on_notify`. Use it from
    one task, between statements on the connection, never during one."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], on_notify: Callable[[psycopg.Notify], None]) -> None:
        self._conn = conn
        self._on_notify = on_notify
        conn.add_notify_handler(on_notify)  # those psycopg reads during our statements
        self.on_socket = False  # test signal: wait() is blocked on the socket

    async def wait(self, timeout_s: float) -> bool:
        """Wait until data arrives on the connection or `timeout_s` passes; hand every
        notification that arrived to `on_notify`. Returns False after a silent `timeout_s` (the
        caller may then probe the connection). A broken connection raises psycopg.OperationalError."""
        if self._read():  # arrived with a statement's answer, not yet taken out of libpq's buffer
            return True
        loop = asyncio.get_running_loop()
        arrived = loop.create_future()
        socket = self._conn.pgconn.socket
        loop.add_reader(socket, _resolve, arrived)
        self.on_socket = True
        try:
            await asyncio.wait_for(arrived, timeout_s)
        except TimeoutError:
            return False
        finally:
            self.on_socket = False
            loop.remove_reader(socket)
        self._read()  # may be a partial message: the next wait reads the rest
        return True

    def _read(self) -> bool:
        """Read what the socket holds, without blocking; deliver complete notifications."""
        pgconn = self._conn.pgconn
        pgconn.consume_input()  # raises OperationalError if the connection is gone
        delivered = False
        encoding = self._conn.info.encoding
        while (note := pgconn.notifies()) is not None:
            self._on_notify(psycopg.Notify(note.relname.decode(encoding), note.extra.decode(encoding), note.be_pid))
            delivered = True
        return delivered


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
