"""Before a worker starts: is the database there, can we log in, is the schema ours?

Errors that waiting cannot fix (a refused login, tried once more first; a bad connection setting;
a missing or older schema, unless `wait_for_schema`) end the process with one clear line; an
unreachable server is retried with backoff (0.5 s doubling to 10 s), one line per try. Which is
which: the one classification of coordinator/pg/errors.py, never a message's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from coordinator.pg.connect import (
    ConnectionLimits,
    StatementTimeout,
    bounded,
    close_quietly,
    connect,
)
from coordinator.pg.dsn import describe_dsn, one_line
from coordinator.pg.errors import ConnectError, Failure, Problem, describe
from dispatcher.backoff import jittered
from dispatcher.db import rows
from dispatcher.db.migrate import available_migrations
from dispatcher.db.queries import query
from dispatcher.errors import DispatcherError

log = logging.getLogger(__name__)

SCHEMA_WAIT_LOG_S = 5.0
UNREACHABLE_BACKOFF_S = (0.5, 10.0)  # first wait, cap


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


async def read_schema(dsn: str, limits: ConnectionLimits) -> SchemaState:
    """Connect once and read the applied migration versions (psycopg errors and StatementTimeout
    propagate to the caller, which knows which are fatal)."""

    async def versions() -> frozenset[int] | None:
        exists = await (await conn.execute(query("schema_version_table_exists"))).fetchone()
        if not rows.value(exists):
            return None
        cur = await conn.execute(query("schema_versions_applied"))
        return frozenset(rows.values(await cur.fetchall()))

    conn = await connect(dsn, limits, application_name="dispatcher-startup")
    try:
        applied = await bounded("schema check", versions(), limits.statement_timeout_s, conn)
    finally:
        await close_quietly(conn)
    return SchemaState(applied, frozenset(m.version for m in available_migrations()))


async def wait_until_ready(
    dsn: str,
    limits: ConnectionLimits,
    *,
    wait_for_schema: bool,
    stopping: asyncio.Event,
    on_state: Callable[[str, str], None] | None = None,
) -> bool:
    """Return True once the database answers with a current schema, False if `stopping` is set
    first; raise StartupError for what waiting cannot fix. `on_state(database, schema)` hears each
    attempt's finding, for /readyz (health.StartupState)."""
    report = on_state or (lambda database, schema: None)
    where = describe_dsn(dsn)
    delay = UNREACHABLE_BACKOFF_S[0]
    last_schema_log = -1e9
    refused_before = False
    loop = asyncio.get_running_loop()
    while not stopping.is_set():
        try:
            state = await read_schema(dsn, limits)
        except ConnectError as exc:
            failure = exc.failure
            if failure.problem is Problem.LOGIN_REFUSED and not refused_before:
                refused_before = True  # once more: see the module docstring
                await _sleep_unless(stopping, UNREACHABLE_BACKOFF_S[0])
                continue
            if not failure.problem.transient:
                raise StartupError(_fatal(where, failure)) from None
            problem = failure.reason
        except StatementTimeout as exc:
            problem = str(exc)
        except psycopg.errors.InsufficientPrivilege as exc:
            # A DML-only role before the migration Job granted it anything
            # (docs/operations/roles.md).
            report("ok", "unreadable")
            if not wait_for_schema:
                raise StartupError(
                    f"cannot read the schema version in {where}: {one_line(exc, dsn)} "
                    "(grant it with `dispatcher grants`)"
                ) from None
            if loop.time() - last_schema_log >= SCHEMA_WAIT_LOG_S:
                log.warning(
                    "cannot read the schema version in %s (%s): waiting for the migration Job's "
                    "`dispatcher grants` (--wait-for-schema)",
                    where,
                    one_line(exc, dsn),
                )
                last_schema_log = loop.time()
            await _sleep_unless(stopping, jittered(1.0, 0.2))
            continue
        except psycopg.Error as exc:
            failure = describe(exc, dsn)
            # e.g. the connection dropped mid-statement is not fatal
            if not failure.problem.transient:
                raise StartupError(
                    f"cannot read the schema version in {where}: {failure.reason}"
                ) from None
            problem = failure.reason
        else:
            report(
                "ok", "current" if not state.missing else "older" if state.applied else "missing"
            )
            if not state.missing:
                if state.newer:
                    log.warning(
                        "schema has migrations this worker does not know (%s): a newer release "
                        "migrated "
                        "it; running, as migrations stay compatible with the release before",
                        state.newer,
                    )
                return True
            what = (
                "no dispatcher schema"
                if state.applied is None
                else f"schema is older than this worker (migrations {state.missing} not applied)"
            )
            if not wait_for_schema:
                raise StartupError(
                    f"{what} in {where}: run `dispatcher migrate` first "
                    "(or start with --wait-for-schema while a migration job runs)"
                )
            if loop.time() - last_schema_log >= SCHEMA_WAIT_LOG_S:
                log.warning(
                    "%s in %s: waiting for `dispatcher migrate` (--wait-for-schema)", what, where
                )
                last_schema_log = loop.time()
            await _sleep_unless(stopping, jittered(1.0, 0.2))
            continue
        refused_before = False
        report("unreachable", "unknown")
        log.warning(
            "database %s unreachable at start (%s): retrying in %.1f s", where, problem, delay
        )
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
    except ConnectError as exc:
        if not exc.failure.problem.transient:
            raise StartupError(_fatal(f"{where} (DISPATCHER_LISTEN_DSN)", exc.failure)) from None
        log.warning(
            "LISTEN server %s (DISPATCHER_LISTEN_DSN) unreachable at start (%s): workers poll "
            "until it answers",
            where,
            exc.failure.reason,
        )
        return
    await close_quietly(conn)


def _fatal(where: str, failure: Failure) -> str:
    """The line a worker exits with when connecting cannot work as configured."""
    if failure.problem is Problem.LOGIN_REFUSED:
        return f"cannot log in to {where}: {failure.reason}"
    return f"cannot connect to {where} ({failure.problem.value}): {failure.reason}"


async def _sleep_unless(stopping: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
