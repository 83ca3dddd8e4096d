"""Before a worker starts: is the database there, can we log in, is the schema ours?

Errors that waiting cannot fix (login refused; a missing or older schema, unless
`wait_for_schema`) end the process with one clear line; an unreachable server is retried with
backoff (0.5 s doubling to 10 s), one line per try.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from coordinator.pg.connect import ConnectionLimits, StatementTimeout, bounded, close_quietly, connect
from coordinator.pg.dsn import describe_dsn, one_line
from dispatcher.backoff import jittered
from dispatcher.db.migrate import available_migrations
from dispatcher.errors import DispatcherError

log = logging.getLogger(__name__)

SCHEMA_WAIT_LOG_S = 5.0
UNREACHABLE_BACKOFF_S = (0.5, 10.0)  # first wait, cap

# Server messages that a later attempt may not see again: the server is not refusing *us*.
_TRANSIENT = ("starting up", "shutting down", "in recovery", "too many clients", "remaining connection slots",
              "not yet accepting", "terminating connection")

_VERSION_TABLE_EXISTS = "SELECT to_regclass('dispatcher_schema_version') IS NOT NULL"
_APPLIED_VERSIONS = "SELECT coalesce(array_agg(version), '{}') FROM dispatcher_schema_version"


class StartupError(DispatcherError):
    """The worker cannot start and waiting would not help (the message says what to do)."""


@dataclass(frozen=True, slots=True)
class SchemaState:
    applied: frozenset[int] | None  # None: no schema at all
    expected: frozenset[int]

    @property
    def missing(self) -> list[int]:
        return sorted(self.expected - (self.applied or frozenset()))

    @property
    def newer(self) -> list[int]:
        return sorted((self.applied or frozenset()) - self.expected)


def login_refused(exc: psycopg.OperationalError) -> bool:
    """The server answered and refused this login for good (as opposed to: could not be reached)."""
    text = str(exc)
    return "FATAL:" in text and not any(marker in text for marker in _TRANSIENT)


async def read_schema(dsn: str, limits: ConnectionLimits) -> SchemaState:
    """Connect once and read the applied migration versions (psycopg errors and StatementTimeout
    propagate to the caller, which knows which are fatal)."""
    async def versions() -> frozenset[int] | None:
        exists = await (await conn.execute(_VERSION_TABLE_EXISTS)).fetchone()
        if not exists or not exists[0]:
            return None
        row = await (await conn.execute(_APPLIED_VERSIONS)).fetchone()
        return frozenset(row[0]) if row else frozenset()

    conn = await connect(dsn, limits, application_name="dispatcher-startup")
    try:
        applied = await bounded("schema check", versions(), limits.statement_timeout_s, conn)
    finally:
        await close_quietly(conn)
    return SchemaState(applied, frozenset(m.version for m in available_migrations()))


async def wait_until_ready(dsn: str, limits: ConnectionLimits, *, wait_for_schema: bool,
                           stopping: asyncio.Event, on_state: Callable[[str, str], None] | None = None) -> bool:
    """Return True once the database answers with a current schema, False if `stopping` is set
    first; raise StartupError for what waiting cannot fix. `on_state(database, schema)` hears each
    attempt's finding, for /readyz (health.StartupState)."""
    report = on_state or (lambda database, schema: None)
    where = describe_dsn(dsn)
    delay = UNREACHABLE_BACKOFF_S[0]
    last_schema_log = -1e9
    loop = asyncio.get_running_loop()
    while not stopping.is_set():
        try:
            state = await read_schema(dsn, limits)
        except psycopg.OperationalError as exc:
            if login_refused(exc):
                raise StartupError(f"cannot log in to {where}: {one_line(exc, dsn)}") from None
            problem = one_line(exc, dsn)
        except StatementTimeout as exc:
            problem = str(exc)
        except psycopg.errors.InsufficientPrivilege as exc:
            # A DML-only role before the migration Job granted it anything (docs/operations/roles.md).
            report("ok", "unreadable")
            if not wait_for_schema:
                raise StartupError(f"cannot read the schema version in {where}: {one_line(exc, dsn)} "
                                   "(grant it with `dispatcher grants`)") from None
            if loop.time() - last_schema_log >= SCHEMA_WAIT_LOG_S:
                log.warning("cannot read the schema version in %s (%s): waiting for the migration Job's "
                            "`dispatcher grants` (--wait-for-schema)", where, one_line(exc, dsn))
                last_schema_log = loop.time()
            await _sleep_unless(stopping, jittered(1.0, 0.2))
            continue
        except psycopg.Error as exc:
            raise StartupError(f"cannot read the schema version in {where}: {one_line(exc, dsn)}") from None
        else:
            report("ok", "current" if not state.missing else "older" if state.applied else "missing")
            if not state.missing:
                if state.newer:
                    log.warning("schema has migrations this worker does not know (%s): a newer release migrated "
                                "it; running, as migrations stay compatible with the release before", state.newer)
                return True
            what = ("no dispatcher schema" if state.applied is None
                    else f"schema is older than this worker (migrations {state.missing} not applied)")
            if not wait_for_schema:
                raise StartupError(f"{what} in {where}: run `dispatcher migrate` first "
                                   "(or start with --wait-for-schema while a migration job runs)")
            if loop.time() - last_schema_log >= SCHEMA_WAIT_LOG_S:
                log.warning("%s in %s: waiting for `dispatcher migrate` (--wait-for-schema)", what, where)
                last_schema_log = loop.time()
            await _sleep_unless(stopping, jittered(1.0, 0.2))
            continue
        report("unreachable", "unknown")
        log.warning("database %s unreachable at start (%s): retrying in %.1f s", where, problem, delay)
        await _sleep_unless(stopping, jittered(delay, 0.2))
        delay = min(delay * 2, UNREACHABLE_BACKOFF_S[1])
    return False


async def check_listen(dsn: str, limits: ConnectionLimits) -> None:
    """DISPATCHER_LISTEN_DSN, when it is not the main DSN: a login the server refuses there is
    fatal (a typo would otherwise only show as wake-ups that never come); an unreachable server
    is logged and left to the listeners' retries, as polling covers the gap."""
    where = describe_dsn(dsn)
    try:
        conn = await connect(dsn, limits, application_name="dispatcher-startup")
    except psycopg.OperationalError as exc:
        if login_refused(exc):
            raise StartupError(f"cannot log in to {where} (DISPATCHER_LISTEN_DSN): {one_line(exc, dsn)}") from None
        log.warning("LISTEN server %s (DISPATCHER_LISTEN_DSN) unreachable at start (%s): workers poll until it "
                    "answers", where, one_line(exc, dsn))
        return
    except StatementTimeout as exc:
        log.warning("LISTEN server %s (DISPATCHER_LISTEN_DSN) unreachable at start (%s): workers poll until it "
                    "answers", where, exc)
        return
    await close_quietly(conn)


async def _sleep_unless(stopping: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stopping.wait(), seconds)
    except TimeoutError:
        pass
