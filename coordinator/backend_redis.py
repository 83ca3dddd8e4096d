"""Redis coordination backend: membership, leadership and bucket ownership in a few keys.

Only who polls which bucket lives here; jobs stay in PostgreSQL. Every read-check-write is one Lua
script (coordinator/redis_scripts.py) on the Redis clock. Key layout: docs/design/coordinator.md.
Unreachable servers, timeouts and READONLY become CoordinatorUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .backend import (
    DRAIN_MAX_S,
    DRAIN_QUIET_S,
    BucketChange,
    BucketState,
    ClusterView,
    check_buckets,
    check_changes,
    check_lease,
    join_reason,
    wakes_waiter,
)
from .buckets import NUM_BUCKETS
from .errors import CoordinatorError, CoordinatorUnavailable, NotLeader
from .redis_scripts import SCRIPTS

# 2 s: a coordinator loop heartbeats every few seconds with leases of ~10 s, so a Redis that
# has not answered in 2 s is treated as down well before any lease could lapse unnoticed.
SOCKET_TIMEOUT_S = 2.0
# PING an idle pooled connection before reusing it after 5 s, so a half-dead socket fails
# (and is replaced) on the ping instead of on a script whose effect would then be unknown.
HEALTH_CHECK_INTERVAL_S = 5
# Dead members stay in the sorted set 10 min (handy with redis-cli), then a heartbeat prunes them.
PRUNE_AFTER_MS = 600_000
# Errors meaning "Redis is not usable right now" (READONLY: we reached a replica after failover).
_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError)


class RedisKeys:
    """Every key and channel name of one cluster, derived from its prefix (the only place)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.members = f"{prefix}:members"
        self.leader = f"{prefix}:leader"
        self.buckets = f"{prefix}:buckets"
        self.channel = f"{prefix}:changes"

    def member(self, member: str) -> str:
        return f"{self.prefix}:member:{member}"


@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    """Redis errors -> CoordinatorUnavailable (down/unreachable) or CoordinatorError (anything
    else), keeping the cause."""
    try:
        yield
    except _UNAVAILABLE as e:
        raise CoordinatorUnavailable(f"redis {what}: {e}") from e
    except RedisError as e:
        raise CoordinatorError(f"redis {what}: {e}") from e


def _lease_ms(lease_s: float) -> int:
    check_lease(lease_s)  # PX 0 is a Redis error, and a zero lease means "already dead" anyway
    return max(1, round(lease_s * 1000))


class RedisBackend:
    """`CoordinatorBackend` on one Redis server; one instance per member's coordinator loop."""

    def __init__(
        self, url: str, *, prefix: str = "dispatcher", num_buckets: int = NUM_BUCKETS
    ) -> None:
        self.url = url
        self.keys = RedisKeys(prefix)
        self.num_buckets = num_buckets
        # Tags our own notifications so wait_for_change() wakes only for *other* members.
        self._token = uuid.uuid4().hex
        # test signal: wait_for_change is blocked on the subscription
        self.waiting = asyncio.Event()
        self._redis: aioredis.Redis | None = None
        self._sub_redis: aioredis.Redis | None = None  # owns the pub/sub connection only
        self._pubsub: PubSub | None = None
        self._scripts: dict[str, Any] = {}

    def _client(self, retries: int, health_check_s: int) -> aioredis.Redis:
        # retries=1 for commands: a pooled socket to a restarted server fails once ("Connection
        # closed by server"; the pool's pre-check does not catch it), then the retry reconnects
        # and succeeds. Only ConnectionError is retried, with no backoff: a dead server refuses
        # the reconnect at once, and a hung one (timeout) is not retried, so callers learn
        # within ~SOCKET_TIMEOUT_S either way. (redis-py's defaults differ by constructor:
        # Redis(host=...) retries 3 times with exponential backoff, from_url() never.)
        # Every script is safe to run twice (epoch checks, compare-and-set), which a retry
        # after a lost reply may do; only the returned count can then read low.
        return aioredis.Redis.from_url(
            self.url,
            decode_responses=True,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            health_check_interval=health_check_s,
            retry=Retry(NoBackoff(), retries, supported_errors=(RedisConnectionError,)),
        )

    async def connect(self) -> None:
        """Create the clients and subscribe. Raises CoordinatorUnavailable if Redis is down,
        but the backend stays usable: later calls connect (and subscribe) on their own."""
        if self._redis is None:
            self._redis = self._client(retries=1, health_check_s=HEALTH_CHECK_INTERVAL_S)
            # The pub/sub client never retries: redis-py would silently reconnect and
            # resubscribe, hiding that notifications were lost meanwhile (see wait_for_change).
            # No health-check PINGs either: a dead server shows as EOF at once, a half-open
            # socket would not answer the PING anyway (TCP keepalive, redis-py's default, ends
            # it), and their filtered PONGs read as "no message", cutting a drain short.
            self._sub_redis = self._client(retries=0, health_check_s=0)
            for name, src in SCRIPTS.items():
                # EVALSHA, reloads on NOSCRIPT
                self._scripts[name] = self._redis.register_script(src)
        if self._pubsub is None:
            with _errors("subscribe"):
                await self._subscribe()

    async def close(self) -> None:
        """Release every connection; never raises, even if Redis is already gone."""
        await self._drop_pubsub()
        for client in (self._redis, self._sub_redis):
            if client is not None:
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
        self._redis = self._sub_redis = None
        self._scripts = {}

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if self._redis is None:
            raise RuntimeError("RedisBackend: call connect() first")
        with _errors(name):
            return await self._scripts[name](keys=keys, args=args)

    def _payload(self, reason: str) -> str:
        return f"{self._token}:{reason}"

    # ----------------------------------------------------------------- membership, leadership

    async def heartbeat(self, member: str, lease_s: float) -> None:
        """Register or refresh `member`; it is live until Redis-now + lease_s."""
        k = self.keys
        lease_ms = _lease_ms(lease_s)
        await self._run(
            "heartbeat",
            [k.members, k.member(member)],
            [k.channel, self._payload(join_reason(member)), member, lease_ms, PRUNE_AFTER_MS],
        )

    async def leave(self, member: str) -> None:
        """Graceful exit: drop the member, release its buckets (to their next_owner if a hand-off
        was pending, else unowned), resign leadership if held, notify everyone."""
        k = self.keys
        await self._run(
            "leave",
            [k.members, k.member(member), k.leader, k.buckets],
            [k.channel, self._payload(f"leave {member}"), member],
        )

    async def try_lead(self, member: str, lease_s: float) -> bool:
        """Win a free or expired leadership, or renew our own (only where leader = member)."""
        lease_ms = _lease_ms(lease_s)
        return bool(await self._run("try_lead", [self.keys.leader], [member, lease_ms]))

    # ----------------------------------------------------------------- buckets

    async def view(self) -> ClusterView:
        k = self.keys
        now, flat_members, leader, pttl, flat_buckets = await self._run(
            "view", [k.members, k.leader, k.buckets], []
        )
        expiries = {
            flat_members[i]: float(flat_members[i + 1]) for i in range(0, len(flat_members), 2)
        }
        try:
            stored = {
                int(flat_buckets[i]): json.loads(flat_buckets[i + 1])
                for i in range(0, len(flat_buckets), 2)
            }
        except ValueError as e:
            raise CoordinatorError(
                f"redis view: unreadable bucket state in {k.buckets!r}: {e}"
            ) from e
        buckets = []
        for b in range(self.num_buckets):
            st = stored.get(b, {})
            deadline = st.get("d")
            buckets.append(
                BucketState(
                    bucket=b,
                    owner=st.get("o"),
                    next_owner=st.get("n"),
                    epoch=int(st.get("e", 0)),
                    revoke_overdue=st.get("n") is not None
                    and deadline is not None
                    and deadline < now,
                )
            )
        # Earliest lease that matters: a live member's expiry or the leader's remaining PTTL
        # (-2 = no key, -1 = no expiry: neither will lapse on its own).
        candidates = [(expiry - now) / 1000 for expiry in expiries.values()]
        if leader is not None and pttl >= 0:
            candidates.append(pttl / 1000)
        return ClusterView(
            members=tuple(sorted(expiries)),
            buckets=tuple(buckets),
            leader=leader,
            next_expiry_s=max(0.0, min(candidates)) if candidates else None,
        )

    async def apply(
        self, leader: str, changes: Sequence[BucketChange], revoke_deadline_s: float
    ) -> int:
        """Leader-only: apply changes whose expected_epoch still matches; notify. Returns how many
        were applied. Raises NotLeader if `leader` does not hold a live leadership."""
        check_changes(changes, self.num_buckets)
        args: list[Any] = [
            self.keys.channel,
            self._payload(f"apply {leader}"),
            leader,
            max(0, round(revoke_deadline_s * 1000)),
        ]
        for c in changes:
            args += [c.bucket, c.expected_epoch, c.kind, c.owner or ""]
        # Even an empty change list goes to Redis: the caller learns whether it still leads.
        applied = int(await self._run("apply", [self.keys.leader, self.keys.buckets], args))
        if applied < 0:
            raise NotLeader(f"{leader!r} does not hold the leadership of {self.keys.prefix!r}")
        return applied

    async def hand_over(self, member: str, buckets: Sequence[int]) -> int:
        """Old owner completes pending hand-offs it holds: owner := next_owner, epoch + 1;
        notify."""
        check_buckets(buckets, self.num_buckets)
        if not buckets:
            return 0
        args: list[Any] = [
            self.keys.channel,
            self._payload(f"hand_over {member}"),
            member,
            *buckets,
        ]
        return int(await self._run("hand_over", [self.keys.buckets], args))

    # ----------------------------------------------------------------- notifications

    async def _subscribe(self) -> None:
        """A fresh subscription, confirmed: once this returns, no later publish can be missed
        (SUBSCRIBE is only *sent* by redis-py; we read its confirmation to know it took effect)."""
        if self._sub_redis is None:
            raise RuntimeError("RedisBackend: call connect() first")
        pubsub = self._sub_redis.pubsub()
        try:
            await pubsub.subscribe(self.keys.channel)
            deadline = asyncio.get_running_loop().time() + SOCKET_TIMEOUT_S
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    raise RedisTimeoutError("no SUBSCRIBE confirmation")
                msg = await pubsub.get_message(timeout=remaining)
                if msg is not None and msg["type"] == "subscribe":
                    break
        except BaseException:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: unannotated
            raise
        self._pubsub = pubsub

    async def _drop_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: unannotated

    def _wakes_us(self, msg: dict[str, Any] | None, joins: bool) -> bool:
        if msg is None or msg["type"] != "message":
            return False
        token, _, reason = str(msg["data"]).partition(":")
        return token != self._token and wakes_waiter(reason, joins)

    async def wait_for_change(self, timeout_s: float, *, joins: bool = True) -> bool:
        """Block until another member notifies a change (True) or the timeout passes (False).

        A burst of notifications is drained, so it costs one wake-up. If the subscription had
        to be (re)made, e.g. after Redis restarted, this returns True at once: notifications
        sent while we were not subscribed are lost, so the caller must re-read the view.
        """
        if self._pubsub is None:
            with _errors("subscribe"):
                await self._subscribe()
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        self.waiting.set()
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                if self._wakes_us(await self._pubsub.get_message(timeout=remaining), joins):
                    break
            drain_until = loop.time() + DRAIN_MAX_S
            while loop.time() < drain_until:  # the rest of the burst
                if await self._pubsub.get_message(timeout=DRAIN_QUIET_S) is None:
                    break
            return True
        except _UNAVAILABLE:
            await self._drop_pubsub()
        except RedisError as e:
            await self._drop_pubsub()
            raise CoordinatorError(f"redis wait_for_change: {e}") from e
        finally:
            self.waiting.clear()
        # The subscription broke: a blip or a restarted server is back at once (True, as
        # above); a dead one raises CoordinatorUnavailable within ~SOCKET_TIMEOUT_S.
        with _errors("resubscribe"):
            await self._subscribe()
        return True
