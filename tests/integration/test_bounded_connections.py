"""Every connect and statement has a bound: a statement that gets no answer in time fails fast,
costs its connection (cancelled on the server), and the next call works on a new one."""

import asyncio
import re
import socket
import threading
import time

import psycopg
import pytest

from coordinator.pg.connect import ConnectionLimits, StatementTimeout, bounded, connect
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreUnavailable
from dispatcher.observe import metrics
from tests.helpers import fetchval, run_async, wait_until, wait_until_async


def test_a_statement_past_its_deadline_fails_at_once_and_is_cancelled_on_the_server(dsn):
    async def main():
        conn = await connect(dsn, ConnectionLimits(), application_name="bounded-test")
        pid = conn.info.backend_pid
        began = time.monotonic()
        with pytest.raises(StatementTimeout, match=re.escape("no answer within 0.3 s")):
            await bounded("sleep", conn.execute("SELECT pg_sleep(30)"), 0.3, conn)
        waited = time.monotonic() - began
        # psycopg cancels it on the server, then the connection is closed, in the background.
        await wait_until_async(lambda: conn.closed, 15, "the abandoned connection is closed")
        return pid, waited

    pid, waited = run_async(main())
    assert waited < 3, "the caller does not wait for the cancellation"
    wait_until(
        lambda: not fetchval(dsn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)),
        15,
        "the server session is gone",
    )


def test_a_connect_to_a_server_that_never_answers_is_bounded():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts the TCP connection (kernel backlog), never says a word
    port = silent.getsockname()[1]
    try:
        began = time.monotonic()
        with pytest.raises((StatementTimeout, psycopg.OperationalError)):
            run_async(
                connect(
                    f"postgresql://x@127.0.0.1:{port}/x",
                    ConnectionLimits(connect_timeout_s=1),
                    application_name="bounded-test",
                )
            )
        assert time.monotonic() - began < 5
    finally:
        silent.close()


def test_a_store_statement_that_overruns_costs_its_connection_and_the_next_call_works(dsn):
    locked = threading.Event()
    release = threading.Event()

    def hold_table_lock():  # a session that holds the table: our claim must wait on it
        with psycopg.connect(dsn) as conn:
            conn.execute("LOCK TABLE dispatcher_jobs IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    before = metrics.STATEMENT_TIMEOUTS.labels("claim")._value.get()

    async def main():
        store = JobStore(dsn, "w1", limits=ConnectionLimits(statement_timeout_s=0.5))
        try:
            first = await store.connection()
            holder = threading.Thread(target=hold_table_lock)
            holder.start()
            assert await asyncio.to_thread(locked.wait, 10)
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match=re.escape("claim: no answer within 0.5 s")):
                await store.jobs_claim("default", 1, 30, None)
            waited = time.monotonic() - began
            release.set()
            await asyncio.to_thread(holder.join, 10)
            # Works again, on a new connection. (No job is enqueued: the abandoned claim may still
            # win the race with its cancel request once the lock goes, and take it.)
            assert (await store.jobs_claim("default", 1, 30, None)).jobs == []
            assert await store.connection() is not first
            return waited
        finally:
            release.set()
            await store.close()

    waited = run_async(main())
    assert waited < 3
    assert metrics.STATEMENT_TIMEOUTS.labels("claim")._value.get() == before + 1
