"""PostgreSQL coordination backend: member rows with leases, a leader row, bucket owners.

Liveness: a lease on the database clock, plus a session advisory lock per member (off behind
PgBouncer: `DISPATCHER_SESSION_LOCKS=false`). Changes are announced by NOTIFY. Errors are
classified once (pg/errors.py): what waiting may fix, a stalled or lost connection included,
becomes CoordinatorUnavailable, so the worker degrades instead of hanging; a refused login, a bad
setting or a missing table becomes CoordinatorError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg

from .backend import (
    DRAIN_MAX_S,
    DRAIN_QUIET_S,
    BucketChange,
    ClusterView,
    check_buckets,
    check_changes,
    check_lease,
    join_reason,
    wakes_waiter,
)
from .buckets import NUM_BUCKETS
from .errors import CoordinatorError, CoordinatorUnavailable, NotLeader
from .pg.connect import ConnectionLimits, StatementTimeout, bounded, close_quietly, connect
from .pg.errors import describe
from .pg.notify import NotificationWait, listen_statement, probe_statement
from .pg.sqlfile import load
from .rows import cluster_view, first_flag

log = logging.getLogger(__name__)
T = TypeVar("T")

CHANNEL = "dispatcher_coordinator"
LOCK_CLASS = 0x62756B  # first key of every member's session advisory lock ("buk"); fixed forever
LISTEN_PROBE_S = 10.0  # a LISTEN connection silent this long runs SELECT 1, so a stall on it shows


def query(name: str) -> str:
    return load("coordinator")[name]


@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    """psycopg errors -> CoordinatorUnavailable (waiting may fix it) or CoordinatorError
    (anything else)."""
    try:
        yield
    except psycopg.Error as exc:
        failure = describe(exc)
        kind = CoordinatorUnavailable if failure.problem.transient else CoordinatorError
        raise kind(f"coordinator {what}: {failure.reason}") from exc


class PostgresBackend:
    def __init__(
        self,
        dsn: str,
        *,
        group: str = "default",
        session_locks: bool = True,
        limits: ConnectionLimits | None = None,
        listen_dsn: str | None = None,
        listen: bool = True,
    ) -> None:
        if not group or ":" in group:
            raise ValueError(f"a coordination group is a non-empty name without ':', got {group!r}")
        self._dsn = dsn
        # Every row and statement is confined to this group: the queue whose buckets it assigns.
        self.group = group
        # LISTEN only: a direct connection when dsn goes through PgBouncer (transaction pooling
        # hears no notification); listen=False: none, changes are seen by polling.
        self._listen_dsn = listen_dsn or dsn
        self._listen_enabled = listen
        # Each operation (up to five statements in one transaction) gets one statement budget.
        self._limits = limits or ConnectionLimits()
        self._session_locks = session_locks
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._locked_as: str | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()  # set while LISTEN is in place
        # Whether the next LISTEN must wake the waiter: true after a lost listener connection or a
        # failed connect(), when notifications may have been missed; false for the first LISTEN
        # of a connect() that succeeds (nothing can have been missed before it returned).
        self._wake_on_listen = False
        self._changed = asyncio.Event()
        # the last wait_for_change's `joins`, for notifications between waits too
        self._wake_on_join = True
        # Tags our own notifications so wait_for_change() wakes only for *other* members.
        self._token = uuid.uuid4().hex
        self.waiting = asyncio.Event()  # test signal: wait_for_change is blocked, listening

    # -- connections -------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection and LISTEN. Like the Redis backend: once this returns, no later
        notification can be missed; if it raises (CoordinatorUnavailable), the backend stays
        usable: later calls connect on their own and the listener keeps retrying."""
        if self._listen_enabled and (self._listener is None or self._listener.done()):
            self._listener = asyncio.create_task(self._listen(), name="coordinator-listen")
        try:
            await self._connection()
            if not self._listen_enabled:
                return
            try:
                await asyncio.wait_for(
                    self._listening.wait(), timeout=self._limits.connect_timeout_s
                )
            except TimeoutError:
                raise CoordinatorUnavailable(
                    f"coordinator listen: no LISTEN within {self._limits.connect_timeout_s:g} s"
                ) from None
        except CoordinatorError:
            self._wake_on_listen = True
            raise

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        conn, self._conn = self._conn, None
        self._locked_as = None
        await close_quietly(conn)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._locked_as = None
            with _errors("connect"):
                self._conn = await connect(
                    self._dsn, self._limits, application_name="dispatcher-coordinator"
                )
        return self._conn

    def _drop(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Never use `conn` again (bounded() abandoned a statement on it and will close it)."""
        if self._conn is conn:
            self._conn = None
            self._locked_as = None

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            try:
                conn = None
                conn = await connect(
                    self._listen_dsn, self._limits, application_name="dispatcher-coordinator-listen"
                )
                listen = listen_statement(CHANNEL)
                await bounded(
                    "listen", conn.execute(listen), self._limits.statement_timeout_s, conn
                )
                if self._wake_on_listen:
                    self._changed.set()  # anything may have happened while we were not listening
                self._wake_on_listen = True
                self._listening.set()
                delay = 0.5
                notifications = NotificationWait(conn, self._on_notification)
                while True:
                    if not await notifications.wait(LISTEN_PROBE_S):
                        probe = conn.execute(probe_statement())
                        await bounded("listen probe", probe, self._limits.statement_timeout_s, conn)
            except (psycopg.Error, StatementTimeout) as exc:
                log.debug("coordination listener lost its connection: %s", exc)
            except Exception:  # keep listening whatever happened
                log.exception("coordination listener failed")
            finally:
                self._listening.clear()
                await close_quietly(conn)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _on_notification(self, note: psycopg.Notify) -> None:
        token, _, rest = note.payload.partition(":")
        group, _, reason = rest.partition(":")
        if (
            token != self._token
            and group == self.group
            and wakes_waiter(reason, self._wake_on_join)
        ):
            self._changed.set()

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {
            "lock_class": LOCK_CLASS,
            "session_locks": self._session_locks,
            "queue": self.group,
            **extra,
        }

    async def _run(
        self, what: str, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        """`work(conn)` with driver errors mapped. A connection the server dropped since our last
        call (restart, failover, terminated session) fails once; then, as the Redis client
        does, reconnect and run it again. Safe: every operation is idempotent (compare-and-set,
        epoch checks), only a count may then read low."""
        for attempt in (1, 2):
            reused = self._conn is not None and not self._conn.closed and not self._conn.broken
            conn = await self._connection()
            try:
                with _errors(what):
                    return await bounded(what, work(conn), self._limits.statement_timeout_s, conn)
            except StatementTimeout as exc:
                self._drop(conn)
                raise CoordinatorUnavailable(f"coordinator {exc}") from None
            except asyncio.CancelledError:
                self._drop(conn)
                raise
            except CoordinatorUnavailable:
                if attempt == 2 or not reused or not conn.broken:
                    raise
                log.debug(
                    "coordination connection was dropped by the server; reconnecting for %s", what
                )
        raise AssertionError("unreachable")

    async def _fetch(
        self,
        conn: psycopg.AsyncConnection[Any],
        statement: str,
        params: dict[str, Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        return await (await conn.execute(statement, params)).fetchall()

    def _payload(self, reason: str) -> str:
        return f"{self._token}:{self.group}:{reason}"

    async def _notify(self, conn: psycopg.AsyncConnection[Any], reason: str) -> None:
        await conn.execute(
            query("notify_change"), {"channel": CHANNEL, "payload": self._payload(reason)}
        )

    async def _lock_member(self, conn: psycopg.AsyncConnection[Any], member: str) -> None:
        """With session locks, take `member`'s advisory lock on our connection (once per
        connection): it is what makes a killed member (and a killed leader) visible at once."""
        if self._session_locks and self._locked_as != member:
            rows = await self._fetch(conn, query("member_lock"), self._params(member=member))
            if not first_flag(rows):
                raise CoordinatorError(
                    f"member lock of {member!r} is held by another session "
                    "(a second process with the same worker id, or one not yet gone)"
                )
            self._locked_as = member

    # -- protocol ----------------------------------------------------------------------------------

    async def heartbeat(self, member: str, lease_s: float) -> None:
        check_lease(lease_s)

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            await self._lock_member(conn, member)
            async with conn.transaction():  # the NOTIFY is sent with the commit, or not at all
                rows = await self._fetch(
                    conn, query("member_heartbeat"), self._params(member=member, lease_s=lease_s)
                )
                if first_flag(rows):  # (re)joined: wake the others
                    await self._notify(conn, join_reason(member))

        await self._run("heartbeat", work)

    async def try_lead(self, member: str, lease_s: float) -> bool:
        check_lease(lease_s)

        async def work(conn: psycopg.AsyncConnection[Any]) -> bool:
            # A leader is deposed at once when its session lock is gone, so hold it before
            # leading, even before this member's first heartbeat (else anyone could take over).
            await self._lock_member(conn, member)
            return bool(
                await self._fetch(
                    conn,
                    query("leader_acquire_or_renew"),
                    self._params(member=member, lease_s=lease_s),
                )
            )

        return await self._run("lead", work)

    async def view(self) -> ClusterView:
        rows = await self._run(
            "view", lambda conn: self._fetch(conn, query("cluster_view"), self._params())
        )
        if not rows:  # the group's first member: create its bucket rows
            await self._run(
                "init",
                lambda conn: conn.execute(
                    query("buckets_init"), self._params(num_buckets=NUM_BUCKETS)
                ),
            )
            rows = await self._run(
                "view", lambda conn: self._fetch(conn, query("cluster_view"), self._params())
            )
        if not rows:
            raise CoordinatorError(
                f"no bucket rows for group {self.group!r}: run `dispatcher migrate`"
            )
        return cluster_view(rows)

    async def apply(
        self, leader: str, changes: Sequence[BucketChange], revoke_deadline_s: float
    ) -> int:
        check_changes(changes)

        async def work(conn: psycopg.AsyncConnection[Any]) -> int:
            async with conn.transaction():
                await conn.execute(query("rebalance_lock"), self._params())
                # Even an empty plan checks: the caller learns whether it still leads.
                if not await self._fetch(conn, query("leader_check"), self._params(member=leader)):
                    raise NotLeader(f"{leader!r} does not hold the leadership")
                if not changes:
                    return 0
                cur = await conn.execute(
                    query("buckets_apply"),
                    self._params(
                        buckets=[c.bucket for c in changes],
                        epochs=[c.expected_epoch for c in changes],
                        kinds=[c.kind for c in changes],
                        owners=[c.owner for c in changes],
                        deadline_s=revoke_deadline_s,
                    ),
                )
                applied = cur.rowcount
                await conn.execute(query("members_prune"))
                if applied:
                    await self._notify(conn, f"apply {leader}")
                return applied

        return await self._run("apply", work)

    async def hand_over(self, member: str, buckets: Sequence[int]) -> int:
        check_buckets(buckets)
        if not buckets:
            return 0

        async def work(conn: psycopg.AsyncConnection[Any]) -> int:
            async with conn.transaction():
                cur = await conn.execute(
                    query("buckets_hand_over"), self._params(member=member, buckets=list(buckets))
                )
                if cur.rowcount:
                    await self._notify(conn, f"hand_over {member}")
                return cur.rowcount

        return await self._run("hand_over", work)

    async def leave(self, member: str) -> None:
        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction():
                params = self._params(member=member)
                await conn.execute(query("member_leave"), params)
                await conn.execute(query("member_leave_buckets"), params)
                await conn.execute(query("leader_resign"), params)
                await self._notify(conn, f"leave {member}")

        await self._run("leave", work)

    async def wait_for_change(self, timeout_s: float, *, joins: bool = True) -> bool:
        self._wake_on_join = joins
        self.waiting.set()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return False
        finally:
            self.waiting.clear()
        loop = asyncio.get_running_loop()
        drain_until = loop.time() + DRAIN_MAX_S
        while True:  # the rest of the burst
            self._changed.clear()
            quiet = min(DRAIN_QUIET_S, drain_until - loop.time())
            if quiet <= 0:
                break
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=quiet)
            except TimeoutError:
                break
        return True
