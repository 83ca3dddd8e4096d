"""RedisBackend against a real Redis (never a mock): what only Redis has.

The behaviour every backend shares (membership, leadership, epochs, hand-overs, leave, invalid
changes, error mapping, notifications) is the contract suite's, run on Redis and PostgreSQL
alike: tests/contract/. Here: key prefixes, and a Redis that dies, restarts or freezes.

The server is `DISPATCHER_TEST_REDIS_URL` when set, else one throwaway embedded Redis per
session; every test gets its own random key prefix, so tests never see each other's state.
Tests that kill or freeze Redis start their own embedded server instead of the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest
import redis

from coordinator.backend import BucketChange, ClusterView
from coordinator.backend_redis import RedisBackend
from coordinator.errors import CoordinatorUnavailable
from dispatcher.devtools.embedded import EmbeddedRedis, start_redis
from tests.contract.support import RedisFactory
from tests.helpers import run_async, wait_until_async

FAST_S = 3.0  # "quickly": a dead Redis must surface within this


@pytest.fixture
def cluster(redis_url: str) -> Iterator[tuple[str, str]]:
    """(url, prefix): a key namespace of this test's own; its keys are deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield redis_url, prefix
    with redis.Redis.from_url(redis_url) as r:
        keys = list(r.scan_iter(match=f"{prefix}:*"))
        if keys:
            r.delete(*keys)


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A private server this test may kill, freeze and restart."""
    server = start_redis()
    try:
        yield server
    finally:
        if server.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)  # in case a test left it frozen
        server.stop()


def backends(url: str, prefix: str, n: int) -> Any:
    """n connected backends on one cluster, one per simulated member."""
    return RedisFactory(url, prefix).connected(n)


async def fails_fast(call: Awaitable[Any]) -> CoordinatorUnavailable:
    t0 = time.monotonic()
    with pytest.raises(CoordinatorUnavailable) as info:
        await call
    assert time.monotonic() - t0 < FAST_S
    assert info.value.__cause__ is not None  # the redis error is kept
    return info.value


def bucket(view: ClusterView, b: int) -> tuple[str | None, str | None, int, bool]:
    s = view.buckets[b]
    return s.owner, s.next_owner, s.epoch, s.revoke_overdue


def assign(b: int, epoch: int, owner: str) -> BucketChange:
    return BucketChange(b, epoch, "assign", owner)


# --------------------------------------------------------------------------- key prefixes


def test_prefixes_isolate_clusters(cluster: tuple[str, str]) -> None:
    url, prefix = cluster

    async def main() -> None:
        async with backends(url, prefix, 1) as [a], backends(url, prefix + "-other", 1) as [other]:
            await a.heartbeat("w1", 10)
            assert await a.try_lead("w1", 10)
            view = await other.view()
            assert view.members == () and view.leader is None
            assert await other.try_lead("w2", 10)  # a separate leadership
            await other.leave("w2")

    run_async(main())


# --------------------------------------------------------------------------- Redis failures


def test_dead_redis_raises_quickly_and_everything_recovers_after_restart(
    own_redis: EmbeddedRedis,
) -> None:
    async def main() -> None:
        async with backends(own_redis.url, "fail", 2) as [a, b]:
            await a.heartbeat("a", 30)
            assert await a.try_lead("a", 30)
            await a.apply("a", [assign(0, 0, "a")], 10)
            assert await b.wait_for_change(5)

            own_redis.kill()
            await fails_fast(a.heartbeat("a", 30))
            await fails_fast(a.try_lead("a", 30))
            await fails_fast(a.view())
            await fails_fast(a.apply("a", [assign(1, 0, "a")], 10))
            await fails_fast(a.hand_over("a", [0]))
            await fails_fast(a.leave("a"))
            await fails_fast(b.wait_for_change(30))  # the subscriber notices too
            await fails_fast(b.wait_for_change(30))  # and keeps failing fast while it is down
            late = RedisBackend(own_redis.url, prefix="fail")
            await fails_fast(late.connect())

            await asyncio.to_thread(own_redis.start_again)  # same port, empty: nothing on disk
            try:
                await a.heartbeat("a", 30)  # pooled sockets to the old server are replaced
                view = await b.view()
                assert view.members == ("a",) and view.leader is None
                assert bucket(view, 0) == (None, None, 0, False)
                assert await a.try_lead("a", 30)
                # Notifications sent while b was not subscribed are lost, so its first
                # wait after re-subscribing reports a change at once ...
                assert await b.wait_for_change(5) is True
                assert await late.wait_for_change(5) is True
                # ... and from then on it waits, and wakes, as usual.
                assert await b.wait_for_change(0.2) is False
                waiter = asyncio.create_task(b.wait_for_change(10))
                await wait_until_async(b.waiting.is_set, 5, "b blocks on its subscription")
                await a.apply("a", [assign(0, 0, "a")], 10)
                assert await waiter is True
                await late.heartbeat("late", 30)
                assert await b.wait_for_change(5) is True
            finally:
                await late.close()

    run_async(main())


def test_subscriber_survives_a_restart_while_waiting(own_redis: EmbeddedRedis) -> None:
    async def main() -> None:
        async with backends(own_redis.url, "fail", 2) as [a, b]:
            waiter = asyncio.create_task(b.wait_for_change(30))
            # the kill must find it waiting
            await wait_until_async(b.waiting.is_set, 5, "b blocks on its subscription")
            own_redis.kill()
            with pytest.raises(CoordinatorUnavailable):
                await asyncio.wait_for(waiter, FAST_S)
            await asyncio.to_thread(own_redis.start_again)
            assert await b.wait_for_change(5) is True  # re-subscribed (and maybe missed some)
            waiter = asyncio.create_task(b.wait_for_change(10))
            await wait_until_async(b.waiting.is_set, 5, "b blocks on its subscription")
            await a.heartbeat("a", 10)
            assert await waiter is True

    run_async(main())


def test_close_does_not_raise_when_redis_is_gone(own_redis: EmbeddedRedis) -> None:
    async def main() -> None:
        a = RedisBackend(own_redis.url, prefix="gone")
        await a.connect()
        await a.heartbeat("a", 10)
        own_redis.kill()
        await a.close()
        await a.close()  # idempotent

    run_async(main())


def test_frozen_redis_times_out_quickly_and_recovers(own_redis: EmbeddedRedis) -> None:
    """A hung server (no RST, just silence) is caught by the socket timeout, not a lease."""

    async def main() -> None:
        async with backends(own_redis.url, "frozen", 1) as [a]:
            await a.heartbeat("a", 30)
            os.kill(own_redis.pid, signal.SIGSTOP)
            try:
                await fails_fast(a.view())
                await fails_fast(a.heartbeat("a", 30))
            finally:
                os.kill(own_redis.pid, signal.SIGCONT)
            assert (await a.view()).members == ("a",)  # the data survived: it was only paused

    run_async(main())
