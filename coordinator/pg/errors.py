"""What went wrong with PostgreSQL, classified once for both packages: `classify(exc)` by SQLSTATE
class and exception type (never by message text), and `diagnose_connect()` for a failed connect,
which has no SQLSTATE, by probing the server step by step. Each package maps a `Problem` to its
own exception. How and why: docs/design/connection-errors.md.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors

from .dsn import describe_dsn, one_line


class Problem(enum.Enum):
    UNREACHABLE = "unreachable"  # no answer, connection lost, server starting up or full: retry
    # the server answered and refused this login (role, database, password, pg_hba)
    LOGIN_REFUSED = "login refused"
    # libpq refuses an option, or the server cannot meet our SSL setting
    BAD_SETTING = "bad connection setting"
    MISSING_SCHEMA = "missing schema"  # one of our tables does not exist: `dispatcher migrate`
    # lock_timeout, statement_timeout, a cancel request or a deadlock ended a statement
    TIMED_OUT = "timed out"
    PERMISSION_DENIED = "permission denied"  # our role lacks a privilege
    OTHER = "other"

    @property
    def transient(self) -> bool:
        """Whether waiting may fix it (a worker retries these, and fails fast on the others)."""
        return self in (Problem.UNREACHABLE, Problem.TIMED_OUT)


# SQLSTATEs of a server that cannot take us *now*: shutting down, starting up, in recovery, full.
# 25006: a read-only replica (failover)
_TRANSIENT_STATES = {"57P01", "57P02", "57P03", "53300", "53000", "25006"}
# At connect time only: 55000 is a database not accepting connections (ALTER DATABASE ...
# ALLOW_CONNECTIONS).
_CONNECT_TRANSIENT_STATES = _TRANSIENT_STATES | {"55000"}
# The classes of a connection that was lost (08) or a server that ran out of something (53).
_TRANSIENT_CLASSES = ("08", "53")
_PROTOCOL_3 = 196608
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_TERMINATE = b"X" + struct.pack("!i", 4)
_SSL_REQUIRED = ("require", "verify-ca", "verify-full")


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified error: the problem and one line about it (password redacted)."""

    problem: Problem
    reason: str
    sqlstate: str | None = None
    hint: str | None = None


class ConnectError(psycopg.OperationalError):
    """Connecting failed; `failure` says why, the message names the server (never the password).
    An OperationalError, so code that caught psycopg's own connect errors still catches it."""

    def __init__(self, failure: Failure, dsn: str) -> None:
        super().__init__(
            f"cannot connect to {describe_dsn(dsn)} ({failure.problem.value}): {failure.reason}"
        )
        self.failure = failure


def classify(exc: BaseException) -> Problem:
    """The problem a psycopg error (or our TimeoutError of a stalled statement) stands for."""
    if isinstance(exc, ConnectError):
        return exc.failure.problem
    if isinstance(exc, TimeoutError):
        return Problem.UNREACHABLE  # a stalled connection: no answer within our own deadline
    state = getattr(exc, "sqlstate", None)
    if isinstance(exc, pgerrors.UndefinedTable):
        return Problem.MISSING_SCHEMA
    if isinstance(exc, (pgerrors.LockNotAvailable, pgerrors.QueryCanceled)) or (
        state or ""
    ).startswith("40"):
        # class 40 too: a lock wait the server ended (deadlock, serialization conflict)
        return Problem.TIMED_OUT
    if isinstance(exc, pgerrors.InsufficientPrivilege):
        return Problem.PERMISSION_DENIED
    if state is not None and (state in _TRANSIENT_STATES or state.startswith(_TRANSIENT_CLASSES)):
        return Problem.UNREACHABLE
    if isinstance(exc, psycopg.ProgrammingError) and state is None:
        return Problem.BAD_SETTING  # libpq could not parse the connection string
    if isinstance(exc, psycopg.OperationalError) and state is None:
        # client-side: the connection broke (a connect is diagnosed apart)
        return Problem.UNREACHABLE
    return Problem.OTHER


def describe(exc: BaseException, dsn: str | None = None) -> Failure:
    """A statement's error, classified, with the server's primary message as the reason."""
    diag = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    reason = one_line(primary or str(exc) or type(exc).__name__, dsn)
    return Failure(
        classify(exc), reason, getattr(exc, "sqlstate", None), diag.message_hint if diag else None
    )


def diagnose_connect(exc: BaseException, dsn: str, timeout_s: float) -> Failure:
    """Why connecting with `dsn` failed with `exc` (blocking: run it in a thread from async code).
    At most four short connections to the server, all of them within `timeout_s`: past it, the
    server counts as unreachable."""
    deadline = time.monotonic() + timeout_s
    if isinstance(exc, ConnectError):
        return exc.failure
    reason = one_line(exc, dsn) or "no answer in time"
    if isinstance(exc, TimeoutError):
        return Failure(Problem.UNREACHABLE, reason)
    if isinstance(exc, psycopg.ProgrammingError):
        return Failure(Problem.BAD_SETTING, reason)
    pgconn = getattr(exc, "pgconn", None)
    if not isinstance(exc, psycopg.OperationalError):
        return Failure(classify(exc), reason)
    if pgconn is None:
        # psycopg resolves host names itself: no pgconn means the name did not resolve (in
        # Kubernetes the Service may not exist yet).
        return Failure(Problem.UNREACHABLE, reason)
    options = {o.keyword.decode(): (o.val or b"").decode() for o in pgconn.info}
    options["host"] = options.get("host") or pgconn.host.decode()  # libpq's default socket folder
    address = _address(options)
    if address is None:  # e.g. a port that is not a number
        return Failure(
            Problem.BAD_SETTING if _rejects_options(dsn, options) else Problem.UNREACHABLE, reason
        )
    if not _answers(address, deadline):
        return Failure(Problem.UNREACHABLE, reason)
    if _rejects_options(dsn, options):
        return Failure(Problem.BAD_SETTING, reason)
    if (
        options.get("sslmode") in _SSL_REQUIRED
        and address[0] != socket.AF_UNIX
        and not _offers_ssl(address, deadline)
    ):
        return Failure(
            Problem.BAD_SETTING, f"sslmode={options['sslmode']} but the server does not offer SSL"
        )
    state = _startup_sqlstate(address, options, deadline)
    # the probe got in, or no answer: whatever it was has passed, or the server went away
    if state == "":
        return Failure(Problem.UNREACHABLE, reason)
    if state is not None and (
        state in _CONNECT_TRANSIENT_STATES or state.startswith(_TRANSIENT_CLASSES)
    ):
        return Failure(Problem.UNREACHABLE, reason, state)
    return Failure(Problem.LOGIN_REFUSED, reason, state)


# -- probes: plain sockets, each bounded -----------------------------------------------------------


def _address(options: dict[str, str]) -> tuple[int, Any] | None:
    """(family, address) libpq last tried: hostaddr (psycopg resolves names) or host, and port;
    a host that is a directory is a Unix socket's."""
    host = (options.get("hostaddr") or options.get("host") or "").split(",")[-1]
    try:
        port = int((options.get("port") or "5432").split(",")[-1] or 5432)
    except ValueError:
        return None
    if not host or host.startswith("/"):
        folder = host or "/var/run/postgresql"
        return socket.AF_UNIX, f"{folder}/.s.PGSQL.{port}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, (host, port)


@contextlib.contextmanager
def _socket(address: tuple[int, Any], deadline: float) -> Any:
    """A connected socket whose every operation gives up at `deadline` (time.monotonic())."""
    sock = socket.socket(address[0], socket.SOCK_STREAM)
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        sock.connect(address[1])
        yield sock
    finally:
        sock.close()


def _answers(address: tuple[int, Any], deadline: float) -> bool:
    try:
        with _socket(address, deadline):
            return True
    except OSError:
        return False


def _rejects_options(dsn: str, options: dict[str, str]) -> bool:
    """libpq checks option values before any network I/O: a bad one makes connect_start BAD at
    once. The address is pinned to the one that just answered, so no name is resolved here."""
    address = {k: options[k] for k in ("host", "hostaddr", "port") if options.get(k)}
    pinned = psycopg.conninfo.make_conninfo(dsn, **address)
    pgconn = psycopg.pq.PGconn.connect_start(pinned.encode())
    try:
        return bool(pgconn.status == psycopg.pq.ConnStatus.BAD)
    finally:
        pgconn.finish()


def _offers_ssl(address: tuple[int, Any], deadline: float) -> bool:
    """The server's answer to an SSLRequest: b'S' it offers SSL, b'N' it does not."""
    try:
        with _socket(address, deadline) as sock:
            sock.sendall(_SSL_REQUEST)
            return bool(sock.recv(1) == b"S")
    except OSError:
        return True  # no answer: not a "no"; the caller goes on


def _startup_sqlstate(
    address: tuple[int, Any], options: dict[str, str], deadline: float
) -> str | None:
    """Send a bare StartupMessage (user, database) and read the answers: the SQLSTATE of the
    server's ErrorResponse; None if it asks for a password (it takes logins: ours was refused);
    '' if it let the probe in or did not answer (the failure has passed). A server that is
    starting up, shutting down or full says so before authentication; one that trusts the probe
    (no password) goes on and says what it says to a login: no such role or database, or the
    database not accepting connections."""
    params = b"".join(
        k.encode() + b"\0" + v.encode() + b"\0"
        for k, v in (("user", options.get("user") or ""), ("database", options.get("dbname") or ""))
        if v
    )
    body = struct.pack("!i", _PROTOCOL_3) + params + b"\0"
    try:
        with _socket(address, deadline) as sock:
            sock.sendall(struct.pack("!i", len(body) + 4) + body)
            while time.monotonic() < deadline:
                kind = _recv(sock, 1)
                payload = _recv(sock, struct.unpack("!i", _recv(sock, 4))[0] - 4)
                if kind == b"E":
                    fields = payload.split(b"\0")
                    return next(
                        (f[1:].decode("ascii", "replace") for f in fields if f[:1] == b"C"), None
                    )
                if kind == b"R" and payload[:4] != b"\0\0\0\0":
                    return None  # a password (or another method) is asked for: stop here
                if kind == b"Z":
                    sock.sendall(_TERMINATE)
                    return ""  # logged in: the server takes this login now
    except (OSError, struct.error):
        pass
    return ""


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data
