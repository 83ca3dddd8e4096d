"""NotificationWait against a real server: every notification once, promptly, whichever path
reads it; a broken connection raises; and an idle wait does not wake up every 0.1 s."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from coordinator.pg.notify import NotificationWait
from tests.helpers import run_async, wait_until_async

CHANNEL = "notification_wait_test"


async def _listening(dsn: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(f"LISTEN {CHANNEL}")
    return conn


@contextlib.asynccontextmanager
async def _waiting(
    dsn: str, on_notify
) -> AsyncIterator[tuple[psycopg.AsyncConnection, NotificationWait]]:
    """A LISTEN connection and its NotificationWait, closed afterwards."""
    conn = await _listening(dsn)
    try:
        yield conn, NotificationWait(conn, on_notify)
    finally:
        await conn.close()


async def _notify(dsn: str, *payloads: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        for payload in payloads:
            await other.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


def test_a_notification_wakes_the_wait_at_once_with_its_payload(dsn):
    async def main():
        got: list[str] = []
        async with _waiting(dsn, lambda note: got.append(note.payload)) as (_, waiter):
            waiting = asyncio.create_task(waiter.wait(30))
            await wait_until_async(lambda: waiter.on_socket, 10, "the wait is on the socket")
            started = time.monotonic()
            await _notify(dsn, "a", "b")
            assert await asyncio.wait_for(waiting, 10) is True
            while len(got) < 2:  # "b" may come in a read of its own
                assert await waiter.wait(10) is True
            assert got == ["a", "b"]
            assert time.monotonic() - started < 10  # woken by the data, not by the 30 s timeout

    run_async(main())


def test_a_notification_read_during_a_statement_is_delivered_once(dsn):
    async def main():
        got: list[str] = []
        async with _waiting(dsn, lambda note: got.append(note.payload)) as (conn, waiter):
            await _notify(dsn, "during")
            # psycopg reads it with this statement's answer: the notify handler delivers it ...
            await conn.execute("SELECT 1")
            await waiter.wait(0.2)  # ... and the wait, reading libpq's queue, does not again
            await waiter.wait(0.2)
            assert got == ["during"]

    run_async(main())


def test_a_silent_wait_times_out_and_a_broken_connection_raises(dsn):
    async def main():
        async with _waiting(dsn, lambda note: None) as (conn, waiter):
            assert await waiter.wait(0.2) is False
            pid = conn.info.backend_pid

            async def wait_as_a_listener_does():
                # the server's last words (an error message) may come in a read of their own
                while True:
                    await waiter.wait(30)

            waiting = asyncio.create_task(wait_as_a_listener_does())
            await wait_until_async(lambda: waiter.on_socket, 10, "the wait is on the socket")
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(psycopg.OperationalError):
                await asyncio.wait_for(waiting, 10)  # at once, not after a 30 s wait

    run_async(main())


def test_an_idle_wait_sets_one_timer_not_one_every_tenth_of_a_second(dsn):
    """psycopg's own `notifies(timeout=1)` schedules a timer every 0.1 s (10 here); the wait sets
    one for its timeout. Timers are counted on an asyncio loop, whose methods can be wrapped."""

    async def main():
        conn = await _listening(dsn)
        waiter = NotificationWait(conn, lambda note: None)
        loop = asyncio.get_running_loop()
        timers = 0
        call_at, call_later = loop.call_at, loop.call_later

        def counting_call_at(*args, **kwargs):
            nonlocal timers
            timers += 1
            return call_at(*args, **kwargs)

        def counting_call_later(*args, **kwargs):
            nonlocal timers
            timers += 1
            return call_later(*args, **kwargs)

        loop.call_at, loop.call_later = counting_call_at, counting_call_later
        try:
            assert await waiter.wait(1.0) is False
            assert timers <= 2, f"{timers} timers in a 1 s idle wait"
            plain = await _listening(dsn)  # no notify handler: notifies() warns beside one
            try:
                timers = 0
                assert [n async for n in plain.notifies(timeout=1.0)] == []
                assert timers >= 5  # the count can fail: psycopg's own wait does wake up in steps
            finally:
                await plain.close()
        finally:
            loop.call_at, loop.call_later = call_at, call_later
            await conn.close()

    asyncio.run(main())
