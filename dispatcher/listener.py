"""LISTEN/NOTIFY wake-ups, with reconnects. Polling remains the fallback if notifications are lost.

Enqueue sends one notification per call (payload `queue` or `queue:bucket`); the listener hands
it to a callback that only sets an event, so a flood of notifications costs one claim per
claim-loop cycle, not one claim per notification or per slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from .backoff import jittered
from .constants import NOTIFY_CHANNEL

log = logging.getLogger(__name__)


def parse_payload(payload: str) -> tuple[str, int | None]:
    """'emails' -> ('emails', None); 'emails:17' -> ('emails', 17)."""
    queue, sep, tail = payload.rpartition(":")
    if sep and tail.isdigit():
        return queue, int(tail)
    return payload, None


def format_payload(queue: str, bucket: int | None) -> str:
    return queue if bucket is None else f"{queue}:{bucket}"


class Listener:
    def __init__(self, dsn: str, queues: set[str], on_notify: Callable[[str, int | None], None],
                 channel: str = NOTIFY_CHANNEL) -> None:
        self._dsn = dsn
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
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()

    async def _run(self) -> None:
        delay = 0.5
        while True:
            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name="dispatcher-listen"
                )
                await self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                self.listening.set()
                delay = 0.5
                # A reconnect may have missed notifications: wake the claim loop once to catch up.
                self._on_notify(next(iter(self._queues)), None)
                async for note in self._conn.notifies():
                    queue, bucket = parse_payload(note.payload)
                    if queue in self._queues:
                        self._on_notify(queue, bucket)
            except psycopg.Error as exc:
                self.listening.clear()
                log.warning("listener lost its connection (%s); polling covers the gap, retrying in %.1f s", exc, delay)
                await asyncio.sleep(jittered(delay))
                delay = min(delay * 2, 10.0)
            finally:
                if self._conn is not None and not self._conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        await self._conn.close()
