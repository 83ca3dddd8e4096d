"""Waiting for notifications on a LISTEN connection without waking up ten times a second.

`NotificationWait.wait()` waits on the socket itself for the whole interval instead of psycopg's
0.1 s steps, and reads what arrived through libpq; none is missed or seen twice. Shared by both
packages. The measurement behind it: docs/design/postgres-plumbing.md.
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

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], on_notify: Callable[[psycopg.Notify], None]
    ) -> None:
        self._conn = conn
        self._on_notify = on_notify
        conn.add_notify_handler(on_notify)  # those psycopg reads during our statements
        self.on_socket = False  # test signal: wait() is blocked on the socket

    async def wait(self, timeout_s: float) -> bool:
        """Wait until data arrives on the connection or `timeout_s` passes; hand every
        notification that arrived to `on_notify`. Returns False after a silent `timeout_s` (the
        caller may then probe the connection). A broken connection raises
        psycopg.OperationalError."""
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
            self._on_notify(
                psycopg.Notify(
                    note.relname.decode(encoding), note.extra.decode(encoding), note.be_pid
                )
            )
            delivered = True
        return delivered


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
