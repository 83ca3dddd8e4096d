"""PostgreSQL connections that never hang: a bound on every connect and on every statement.

`connect()` sets connect_timeout, TCP keepalives and tcp_user_timeout; `bounded()` gives each
statement a deadline and abandons the connection on overrun (a cancel request stops the server
side). No session statement_timeout: it would leak through PgBouncer; one-shot commands begin each
transaction with `local_timeouts()` instead. A failed connect raises `ConnectError`, classified by
errors.py (unreachable, login refused, bad setting). Shared by both packages.
Why: docs/design/postgres-plumbing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from .errors import ConnectError, Failure, Problem, diagnose_connect
from .sqlfile import load

T = TypeVar("T")

# A peer that vanished (packets dropped, no FIN/RST) is declared dead after 5 s of silence plus
# 3 unanswered probes 2 s apart: 11 s. Data we sent that stays unacknowledged for 10 s fails the
# socket (tcp_user_timeout, Linux). Both only catch a path that drops packets; a peer that keeps
# the socket open but stops answering is caught by the statement deadlines.
KEEPALIVES_IDLE_S = 5
KEEPALIVES_INTERVAL_S = 2
KEEPALIVES_COUNT = 3
TCP_USER_TIMEOUT_MS = 10_000
# All the probes that classify a failed connect (errors.py), together: they run only after a
# failure, against a server that just answered (or refused) at once.
_PROBE_BUDGET_S = 2.0


class StatementTimeout(TimeoutError):
    """A statement (or a connect) got no answer within its deadline; the connection is abandoned."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(
            f"{what}: no answer within {timeout_s:g} s (connection stalled or server overloaded)"
        )
        self.what = what
        self.timeout_s = timeout_s


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connect and a statement may take. `statement_timeout_s` is the budget of a
    short statement; callers give longer ones (ANALYZE, pruning) a multiple of it. Also whether
    the connection may use prepared statements (see the module docstring)."""

    connect_timeout_s: float = 5.0
    statement_timeout_s: float = 5.0
    prepared_statements: bool = True

    def __post_init__(self) -> None:
        if not self.connect_timeout_s > 0 or not self.statement_timeout_s > 0:
            raise ValueError("connection limits must be > 0")

    def connect_kwargs(self) -> dict[str, Any]:
        """libpq parameters for a connection with these limits."""
        return {
            # libpq takes whole seconds and treats 1 as 2; round up so we never wait less than
            # asked.
            "connect_timeout": max(2, int(-(-self.connect_timeout_s // 1))),
            "keepalives": 1,
            "keepalives_idle": KEEPALIVES_IDLE_S,
            "keepalives_interval": KEEPALIVES_INTERVAL_S,
            "keepalives_count": KEEPALIVES_COUNT,
            "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
        }


# Statements abandoned on overrun, still finishing psycopg's cancel-and-close in the background.
# Referenced here so they are not garbage-collected mid-flight.
_abandoned: set[asyncio.Task[Any]] = set()
# Their connections: only the abandoned statement may close one, once it is done. Closing it
# earlier would free its socket's fd while the event loop still watches it for that statement;
# the next connection reuses the fd number and libuv aborts the process (seen: SIGABRT).
_abandoned_conns: set[int] = set()  # id() of the connections


async def connect(
    dsn: str, limits: ConnectionLimits, *, application_name: str, **kwargs: Any
) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection with the limits' timeouts. ConnectError says why not, in one line:
    unreachable (also a handshake that stalls past connect_timeout_s, +1 s for libpq's own timer
    to fire first), login refused or a bad setting (errors.py, diagnosed in a thread)."""
    if not limits.prepared_statements:
        kwargs["prepare_threshold"] = None
    began = time.monotonic()
    try:
        async with asyncio.timeout(limits.connect_timeout_s + 1.0):
            return await psycopg.AsyncConnection.connect(
                dsn,
                autocommit=True,
                application_name=application_name,
                **limits.connect_kwargs(),
                **kwargs,
            )
    except TimeoutError:
        raise ConnectError(_stalled(limits), dsn) from None
    except psycopg.Error as exc:
        if _timed_out(limits, began):
            raise ConnectError(_stalled(limits), dsn) from None
        failure = await asyncio.to_thread(diagnose_connect, exc, dsn, _PROBE_BUDGET_S)
        raise ConnectError(failure, dsn) from None


def connect_sync(
    dsn: str, limits: ConnectionLimits, *, application_name: str, **kwargs: Any
) -> psycopg.Connection[Any]:
    """connect() for sync code (the one-shot commands): the same bounds, the same ConnectError.
    Prepared statements off: each statement runs once or twice (and PgBouncer, above)."""
    began = time.monotonic()
    try:
        return psycopg.connect(
            dsn,
            autocommit=True,
            application_name=application_name,
            prepare_threshold=None,
            **limits.connect_kwargs(),
            **kwargs,
        )
    except psycopg.Error as exc:
        if _timed_out(limits, began):
            raise ConnectError(_stalled(limits), dsn) from None
        raise ConnectError(diagnose_connect(exc, dsn, _PROBE_BUDGET_S), dsn) from None


def _timed_out(limits: ConnectionLimits, began: float) -> bool:
    """Whether libpq gave up at its connect_timeout: the server did not answer in time, which
    needs no probe (and another wait) to classify."""
    timeout_s = float(limits.connect_kwargs()["connect_timeout"])
    return time.monotonic() - began >= timeout_s - 0.25


def _stalled(limits: ConnectionLimits) -> Failure:
    return Failure(
        Problem.UNREACHABLE, f"no answer within {limits.connect_timeout_s:g} s (connection stalled)"
    )


def local_timeouts(conn: psycopg.Connection[Any], statement_s: float, lock_s: float) -> None:
    """statement_timeout and lock_timeout for the transaction `conn` is in (SET LOCAL: nothing
    leaks through a PgBouncer pool). A one-shot command then fails in bounded time on a lock
    (55P03 lock_not_available) or a slow statement (57014 query_canceled) instead of hanging."""
    conn.execute(
        load("coordinator")["local_timeouts"],
        {
            "statement": f"{max(1, int(statement_s * 1000))}ms",
            "lock": f"{max(1, int(lock_s * 1000))}ms",
        },
        prepare=False,
    )


async def bounded(
    what: str, work: Awaitable[T], timeout_s: float, conn: psycopg.AsyncConnection[Any]
) -> T:
    """Await `work` (statements on `conn`) for at most `timeout_s`.

    On overrun, or if our caller is cancelled meanwhile, `work` is cancelled and left to finish
    in the background: psycopg sends the server a cancel request, then we close `conn`. We
    return at once (StatementTimeout, or the CancelledError): awaiting psycopg's cancellation
    would hand the stall to the caller for up to ~10 s more. The caller must drop `conn`."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout_s)
    except asyncio.CancelledError:
        _abandon(task, conn)
        raise
    if not done:
        _abandon(task, conn)
        raise StatementTimeout(what, timeout_s)
    return task.result()


def _abandon(task: asyncio.Task[Any], conn: psycopg.AsyncConnection[Any]) -> None:
    task.cancel()  # psycopg: a cancel request to the server, then it gives up (bounded at ~10 s)
    _abandoned_conns.add(id(conn))
    closer = asyncio.ensure_future(_close_after(task, conn))
    _abandoned.add(closer)
    closer.add_done_callback(_abandoned.discard)


async def _close_after(task: asyncio.Task[Any], conn: psycopg.AsyncConnection[Any]) -> None:
    """Close `conn` once the abandoned statement is done and no other statement is on it.

    Under the connection's lock, because other tasks may have statements queued on it (services
    sharing a store): psycopg holds the lock while it waits on the socket, and closing the socket
    under such a wait frees an fd the event loop still watches (libuv then aborts the process)."""
    try:
        await asyncio.wait((task,))  # not `await task`: its cancellation is not ours
        if not task.cancelled():
            with contextlib.suppress(BaseException):
                task.result()  # retrieved: no "exception was never retrieved" warning
        async with conn.lock:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()  # sync and local: never waits on the peer
    finally:
        _abandoned_conns.discard(id(conn))


async def close_quietly(conn: psycopg.AsyncConnection[Any] | None) -> None:
    """Close a connection that may be stalled or broken without waiting on the network (the
    Terminate message only goes into the socket buffer). One with an abandoned statement in
    flight is left to that statement, which closes it when it is done (see _abandoned_conns)."""
    if conn is not None and not conn.closed and id(conn) not in _abandoned_conns:
        with contextlib.suppress(Exception):
            await conn.close()
