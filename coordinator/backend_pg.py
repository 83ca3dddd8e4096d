"""PostgreSQL coordination backend: member rows with leases, a leader row, bucket owners.

Liveness is two signals on the database clock:
- a lease (`expires_at`), refreshed by heartbeats. It catches a worker whose process is stuck
  while its connection stays open;
- a session advisory lock per member, held on the coordination connection. It catches a killed
  worker at once: PostgreSQL drops the lock with the connection.

PgBouncer caveat: in transaction pooling mode a session lock is not tied to one client, so set
`DISPATCHER_SESSION_LOCKS=false` there. Liveness then rests on leases alone (a death shows
within one lease); the rebalance lock is transaction-scoped and works either way.

Notifications (`LISTEN dispatcher_coordinator`) arrive on a second connection; a lost one only
delays a change until the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql

from dispatcher.queries import query as _query

from .backend import BucketChange, BucketState, ClusterView, CoordinatorUnavailable, NotLeader

log = logging.getLogger(__name__)

CHANNEL = "dispatcher_coordinator"
LOCK_CLASS = 0x62756B  # first key of every member's session advisory lock ("buk"); fixed forever


def query(name: str) -> str:
    return _query(name, package="coordinator")


@contextlib.contextmanager
def _unavailable(what: str) -> Iterator[None]:
    try:
        yield
    except psycopg.Error as exc:
        raise CoordinatorUnavailable(f"coordinator {what}: {exc}") from exc


class PostgresBackend:
    def __init__(self, dsn: str, *, session_locks: bool = True) -> None:
        self._dsn = dsn
        self._session_locks = session_locks
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._locked_as: str | None = None
        self._listener: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    # -- connections ---------------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._connection()
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name="coordinator-listen")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
            self._locked_as = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._locked_as = None
            with _unavailable("connect"):
                self._conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name="dispatcher-coordinator", connect_timeout=5
                )
        return self._conn

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name="dispatcher-coordinator-listen", connect_timeout=5
                ) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    self._changed.set()  # anything may have happened while we were not listening
                    delay = 0.5
                    async for _ in conn.notifies():
                        self._changed.set()
            except psycopg.Error as exc:
                log.debug("coordination listener lost its connection: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"lock_class": LOCK_CLASS, "session_locks": self._session_locks, **extra}

    async def _execute(self, what: str, statement: str, params: dict[str, Any]) -> psycopg.AsyncCursor[Any]:
        conn = await self._connection()
        with _unavailable(what):
            return await conn.execute(statement, params)

    async def _notify(self, payload: str) -> None:
        await self._execute("notify", query("notify_change"), {"channel": CHANNEL, "payload": payload})

    # -- protocol ------------------------------------------------------------------------------------

    async def heartbeat(self, member: str, lease_s: float) -> None:
        if self._session_locks and self._locked_as != member:
            row = await (await self._execute("lock", query("member_lock"), self._params(member=member))).fetchone()
            if not row or not row[0]:
                raise CoordinatorUnavailable(f"member lock of {member!r} is held by another session")
            self._locked_as = member
        cur = await self._execute("heartbeat", query("member_heartbeat"), {"member": member, "lease_s": lease_s})
        row = await cur.fetchone()
        if row and row[0]:
            await self._notify(f"join:{member}")

    async def try_lead(self, member: str, lease_s: float) -> bool:
        cur = await self._execute("lead", query("leader_acquire_or_renew"), self._params(member=member, lease_s=lease_s))
        return await cur.fetchone() is not None

    async def view(self) -> ClusterView:
        rows = await (await self._execute("view", query("cluster_view"), self._params())).fetchall()
        if not rows:
            raise CoordinatorUnavailable("dispatcher_bucket_owners is empty: run `dispatcher migrate`")
        first = rows[0]
        return ClusterView(
            members=tuple(first[5]),
            buckets=tuple(BucketState(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows),
            leader=first[6],
            next_expiry_s=first[7],
        )

    async def apply(self, leader: str, changes: Sequence[BucketChange], revoke_deadline_s: float) -> int:
        if not changes:
            return 0
        conn = await self._connection()
        with _unavailable("apply"):
            async with conn.transaction():
                await conn.execute(query("rebalance_lock"), self._params())
                if await (await conn.execute(query("leader_check"), {"member": leader})).fetchone() is None:
                    raise NotLeader(f"{leader} no longer leads")
                cur = await conn.execute(query("buckets_apply"), {
                    "buckets": [c.bucket for c in changes], "epochs": [c.expected_epoch for c in changes],
                    "kinds": [c.kind for c in changes], "owners": [c.owner for c in changes],
                    "deadline_s": revoke_deadline_s,
                })
                applied = cur.rowcount
                await conn.execute(query("members_prune"))
                if applied:
                    await conn.execute(query("notify_change"), {"channel": CHANNEL, "payload": "assign"})
        return applied

    async def hand_over(self, member: str, buckets: Sequence[int]) -> int:
        if not buckets:
            return 0
        cur = await self._execute("hand_over", query("buckets_hand_over"), {"member": member, "buckets": list(buckets)})
        if cur.rowcount:
            await self._notify(f"handover:{member}")
        return cur.rowcount

    async def leave(self, member: str) -> None:
        conn = await self._connection()
        with _unavailable("leave"):
            async with conn.transaction():
                await conn.execute(query("member_leave"), {"member": member})
                await conn.execute(query("member_leave_buckets"), {"member": member})
                await conn.execute(query("leader_resign"), {"member": member})
                await conn.execute(query("notify_change"), {"channel": CHANNEL, "payload": f"leave:{member}"})

    async def wait_for_change(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return False
        self._changed.clear()
        return True
