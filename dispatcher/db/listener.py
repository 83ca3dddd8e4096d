"""LISTEN/NOTIFY wake-ups, with reconnects. Polling remains the fallback if notifications are lost.

An idle LISTEN connection is probed (`SELECT 1`) after `probe_s` and reopened if it does not
answer. A notification only sets an event (or arms the due timer), so a flood costs one claim per
claim-loop cycle. Payloads: `queue`, `queue:bucket`, `queue:bucket:ms_until_run_at`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from coordinator.pg.connect import (
    ConnectionLimits,
    StatementTimeout,
    bounded,
    close_quietly,
    connect,
)
from coordinator.pg.notify import NotificationWait, listen_statement, probe_statement
from dispatcher.backoff import jittered
from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db.translate import said

log = logging.getLogger(__name__)


def parse_payload(payload: str) -> tuple[str, int | None, float | None]:
    """'emails' -> ('emails', None, None); 'emails:17' -> ('emails', 17, None); 'emails:17:1500'
    -> ('emails', 17, 1.5): bucket 17's job is due in 1,500 ms. Queue names have no ':'
    (NAME_PATTERN); anything else comes back whole as the queue, which matches no queue."""
    parts = payload.split(":")
    if len(parts) == 2 and parts[1].isdigit():
        return parts[0], int(parts[1]), None
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2]) / 1000
    return payload, None, None


def format_payload(queue: str, bucket: int | None) -> str:
    return queue if bucket is None else f"{queue}:{bucket}"


class Listener:
    def __init__(
        self,
        dsn: str,
        queues: set[str],
        on_notify: Callable[[str, int | None, float | None], None],
        channel: str = NOTIFY_CHANNEL,
        *,
        limits: ConnectionLimits | None = None,
        probe_s: float = 10.0,
    ) -> None:
        self._dsn = dsn
        self._limits = limits or ConnectionLimits()
        self._probe_s = probe_s
        self._queues = queues
        self._on_notify = on_notify
        self._channel = channel
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.listening = asyncio.Event()  # test signal

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await close_quietly(self._conn)

    def _deliver(self, note: psycopg.Notify) -> None:
        queue, bucket, due_in_s = parse_payload(note.payload)
        if queue in self._queues:
            self._on_notify(queue, bucket, due_in_s)

    async def _run(self) -> None:
        delay = 0.5
        timeout_s = self._limits.statement_timeout_s
        while True:
            try:
                self._conn = conn = await connect(
                    self._dsn, self._limits, application_name="dispatcher-listen"
                )
                listen = listen_statement(self._channel)
                await bounded("listen", conn.execute(listen), timeout_s, conn)
                self.listening.set()
                delay = 0.5
                # A reconnect may have missed notifications: wake the claim loop once to catch up.
                self._on_notify(next(iter(self._queues)), None, None)
                notifications = NotificationWait(conn, self._deliver)
                while True:
                    if not await notifications.wait(jittered(self._probe_s, 0.2)):
                        await bounded(
                            "listen probe", conn.execute(probe_statement()), timeout_s, conn
                        )
            except (psycopg.Error, StatementTimeout) as exc:
                self.listening.clear()
                log.warning(
                    "listener lost its connection (%s); polling covers the gap, retrying in %.1f s",
                    said(exc, self._dsn),  # one line: libpq's own texts span three
                    delay,
                )
                await asyncio.sleep(jittered(delay))
                delay = min(delay * 2, 10.0)
            finally:
                await close_quietly(self._conn)
