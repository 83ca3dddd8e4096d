"""The job store: every statement the worker runs, with typed results, over one connection.

Each worker loop owns one `JobStore`, so one autocommit connection and one round trip per
statement (docs/design/postgres-plumbing.md). psycopg errors become our own (translate.py); a
broken connection is reopened on the next call.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg.types.json import set_json_dumps, set_json_loads

from coordinator.pg.connect import ConnectionLimits, StatementTimeout, bounded, close_quietly
from coordinator.pg.connect import connect as connect_bounded
from dispatcher.constants import (
    ATTEMPT_ERRORS_KEPT,
    COMPLETED_ARCHIVE,
    COMPLETED_DELETE,
    COMPLETED_JOBS,
    COMPLETED_KEEP,
    LAST_ERROR_MAX_CHARS,
    NOTIFY_CHANNEL,
    RESULTS_CHANNEL,
)
from dispatcher.db import rows
from dispatcher.db.citus import distributed_async
from dispatcher.db.claims import ClaimTexts, allowance, claim_params, next_token_s
from dispatcher.db.claims import claim_sql as claim_sql  # (tests take the claims from here)
from dispatcher.db.claims import steal_sql as steal_sql
from dispatcher.db.completions import completion_statements
from dispatcher.db.dependencies import release_async
from dispatcher.db.literals import int_array, token_array
from dispatcher.db.progress import ProgressReport, ProgressWritten, report_progress
from dispatcher.db.queries import query
from dispatcher.db.rows import (
    Chain,
    Claimed,
    Completion,
    ExpiredLease,
    FailedWrite,
    Failure,
    FlowState,
    Gate,
    HistoryRows,
    LimitLock,
    OrderingScan,
    ResultText,
    Steal,
    TypeFilter,
)
from dispatcher.db.sharded import ShardedStatements
from dispatcher.db.store_offpath import SLOW_STATEMENT as SLOW_STATEMENT
from dispatcher.db.store_offpath import OffPathStatements
from dispatcher.db.translate import connect_errors, translate_errors
from dispatcher.errors import StoreError, StoreUnavailable
from dispatcher.model import Job
from dispatcher.observe import metrics
from dispatcher.observe.job_metrics import JOB_STATS

log = logging.getLogger(__name__)
T = TypeVar("T")

FEATURE_NOT_SUPPORTED = "0A000"


def configure_json(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> None:
    """orjson both ways: about 5x faster than the stdlib json psycopg uses by default."""
    set_json_loads(orjson.loads, conn)
    set_json_dumps(orjson.dumps, conn)


class JobStore(OffPathStatements):
    """One connection's worth of job statements. Tasks that share a store (the maintenance
    services) take turns: one statement, or one transaction of a few (a prune round), at a time,
    so that no task's statement lands inside another's transaction; and the lock below makes
    concurrent first calls share one connect instead of each opening (and leaking) one."""

    def __init__(
        self,
        dsn: str,
        worker_id: str,
        *,
        application_name: str = "dispatcher",
        limits: ConnectionLimits | None = None,
        completed_jobs: str = COMPLETED_KEEP,
    ) -> None:
        if completed_jobs not in COMPLETED_JOBS:
            raise ValueError(
                f"completed_jobs must be one of {', '.join(COMPLETED_JOBS)}, got {completed_jobs!r}"
            )
        self._dsn = dsn
        self.worker_id = worker_id
        self._application_name = application_name
        self._limits = limits or ConnectionLimits()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._connecting = asyncio.Lock()
        # One statement or transaction at a time on the connection (uncontended: ~0.3 us). One lock
        # per connection: an abandoned statement keeps its own until psycopg gives it up (~10 s).
        self._turn = asyncio.Lock()
        self._claim_text = ClaimTexts()  # each claim's statement, cached per bucket set
        # DISPATCHER_COMPLETED_JOBS, chosen once: the completion's hot path reads one attribute.
        self.completed_jobs = completed_jobs
        # The keyless and the keyed completion statement (completions.py).
        self._complete_sql = completion_statements(completed_jobs)
        # Jobs with a result: their rows stay readable, kept (under delete too) or archived.
        self._complete_result_sql = completion_statements(
            COMPLETED_KEEP if completed_jobs == COMPLETED_DELETE else completed_jobs
        )
        # Set at each connect when the jobs table is distributed (Citus): then the hot statements
        # go bucket by bucket (sharded.py).
        self.sharded: ShardedStatements | None = None

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn  # the hot path: no lock
        async with self._connecting:
            if self._conn is None or self._conn.closed:
                with connect_errors(self._dsn):
                    conn = await connect_bounded(
                        self._dsn, self._limits, application_name=self._application_name
                    )
                configure_json(conn)
                with translate_errors("connect"):
                    self.sharded = await self._sharded_statements(conn)
                self._conn, self._turn = conn, asyncio.Lock()
            return self._conn

    async def _sharded_statements(
        self, conn: psycopg.AsyncConnection[Any]
    ) -> ShardedStatements | None:
        """Per-bucket statements if the jobs table is distributed now (Citus), else None."""
        if not await distributed_async(conn):
            return None
        keeps = self.completed_jobs == COMPLETED_KEEP
        completion = query("jobs_complete_owned" if keeps else "jobs_complete_owned_delete")
        return ShardedStatements(
            self._execute,
            self.worker_id,
            completion,
            NOTIFY_CHANNEL,
            archive=self.completed_jobs == COMPLETED_ARCHIVE,
        )

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        await close_quietly(conn)

    async def _execute(
        self, what: str, sql: str, params: dict[str, Any], *, budget: float = 1.0
    ) -> psycopg.AsyncCursor[Any]:
        """One statement, bounded by `budget` x statement_timeout_s. A statement that overruns
        (or whose caller is cancelled) costs us its connection: the next call opens a new one."""
        return await self.run(what, lambda conn: conn.execute(sql, params), budget=budget)

    async def run(
        self,
        what: str,
        work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        budget: float = 1.0,
    ) -> T:
        """`work(conn)` (a statement, or a transaction of a few: janitor.py), bounded like
        `_execute`; the wait for our turn on the connection counts against the bound, as
        psycopg's own wait for the connection did before transactions shared it."""
        conn = await self.connection()
        turn = self._turn  # the connection's (no await since connection() set or returned it)
        timeout_s = self._limits.statement_timeout_s * budget

        async def in_turn() -> T:
            async with turn:
                return await work(conn)

        try:
            with translate_errors(what):
                return await bounded(what, in_turn(), timeout_s, conn)
        except StoreError as exc:
            # A statement Citus cannot route, on a connection made while the table was still on
            # one node: it was distributed since. Reconnect to read the placement again.
            unroutable = getattr(exc.__cause__, "sqlstate", None) == FEATURE_NOT_SUPPORTED
            if unroutable and self.sharded is None and self._conn is conn:
                self._conn = None
                await close_quietly(conn)
            raise
        except StatementTimeout as exc:
            self._forget(conn)
            metrics.STATEMENT_TIMEOUTS.labels(what).inc()
            raise StoreUnavailable(str(exc)) from None
        except asyncio.CancelledError:
            self._forget(conn)  # bounded() abandoned the statement, and the connection with it
            raise

    async def _placement(self) -> ShardedStatements | None:
        """The per-bucket statements if the jobs table is distributed (read at connect)."""
        if self._conn is None or self._conn.closed:
            await self.connection()
        return self.sharded

    def _forget(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._conn is conn:
            self._conn = None

    # -- claim ---------------------------------------------------------------------------------

    async def jobs_claim(
        self,
        queue: str,
        limit: int,
        lease_s: float,
        buckets: Sequence[int] | None,
        steal: Steal | None = None,
        *,
        outside: Sequence[int] | None = None,
        types: TypeFilter | None = None,
        gate: Gate | None = None,
        flow_version: int | None = None,
    ) -> Claimed:
        """Claim up to `limit` runnable jobs in one statement: from `buckets` (partitioned), from
        everything with SKIP LOCKED (`buckets=None`), or stealing (`steal`: see rows.Steal). With
        how many runnable jobs its selection found: more than it claimed means others took some
        meanwhile, not that the buckets ran dry. `types`: only those job types, or all but them;
        `gate`: jobs of flow-controlled types, claimed under their limits (_claim_gated);
        `flow_version`: the flow-control tables as the caller last read them (if they changed
        since, nothing is claimed and the result is `stale`); `outside`: as the port says."""
        if gate is not None:
            if steal is not None or types is not None or outside:
                raise ValueError(
                    "a gated claim takes its types from its gate, never steals, reads no window"
                )
            return await self._claim_gated(queue, limit, lease_s, buckets, gate, flow_version)
        sharded = await self._placement()
        if sharded is not None:
            # `outside` is not read: a cluster claims bucket by bucket, so priority holds within a
            # bucket there (docs/concepts/citus.md)
            if steal is not None:  # not routed yet: the owners drain their own buckets
                return Claimed([], 0)
            claimed = await sharded.claim(queue, limit, lease_s, buckets, types, flow_version)
            if claimed.jobs:
                JOB_STATS.waited(queue, claimed.waited_s)
            return claimed
        token = str(uuid.uuid4())
        window = outside if steal is None and buckets is not None and outside else None
        params = claim_params(
            queue, limit, lease_s, self.worker_id, token, flow_version, types, window
        )
        if steal is not None:
            sql = self._claim_text(None, types, steal=True)
            params["steal_buckets"] = int_array(steal.buckets)
            params["steal_reserve"] = steal.reserve
        else:
            sql = self._claim_text(buckets, types, window=window is not None)
        cur = await self._execute("claim", sql, params)
        claimed = rows.claimed(await cur.fetchall(), token, queue)
        if claimed.jobs:
            JOB_STATS.waited(queue, claimed.waited_s)
        return claimed

    async def _claim_gated(
        self,
        queue: str,
        limit: int,
        lease_s: float,
        buckets: Sequence[int] | None,
        gate: Gate,
        flow_version: int | None,
    ) -> Claimed:
        """Claim jobs of flow-controlled types (`gate`) in one transaction: lock their limit rows,
        count what runs under them, claim at most what they allow (claims.allowance), spend the
        rates' tokens. Others claiming under the same rows wait for this transaction."""
        keys = {"types": [k[0] for k in gate.keys], "queues": [k[1] for k in gate.keys]}
        token = str(uuid.uuid4())
        sharded = await self._placement()
        sql = self._claim_text(buckets, gate.types) if sharded is None else ""

        async def work(conn: psycopg.AsyncConnection[Any]) -> Claimed:
            async with conn.transaction():
                cur = await conn.execute(query("flow_gate_lock"), keys)
                locked = rows.typed(LimitLock, await cur.fetchall())
                counted = [lock for lock in locked if lock.max_running is not None]
                running: list[int] = []
                if counted and sharded is not None:
                    running = await sharded.running_under(conn, counted)
                elif counted:
                    cur = await conn.execute(
                        query("flow_gate_running"),
                        {
                            "types": [lock.job_type for lock in counted],
                            "queues": [lock.queue for lock in counted],
                        },
                    )
                    running = [int(n) for n in rows.values(await cur.fetchall())]
                counts = iter(running)
                allowed, held_by = allowance(
                    [
                        (
                            lock.max_running,
                            next(counts) if lock.max_running is not None else 0,
                            lock.tokens,
                        )
                        for lock in locked
                    ]
                )
                asked = limit if allowed is None else min(limit, allowed)
                claimed = Claimed([], 0)
                if asked > 0 and sharded is not None:

                    async def in_transaction(
                        what: str, text: str, params: dict[str, Any]
                    ) -> psycopg.AsyncCursor[Any]:
                        return await conn.execute(text, params)

                    claimed = await sharded.claim(
                        queue,
                        asked,
                        lease_s,
                        buckets,
                        gate.types,
                        flow_version,
                        execute=in_transaction,
                    )
                elif asked > 0:
                    params = claim_params(
                        queue, asked, lease_s, self.worker_id, token, flow_version, gate.types
                    )
                    claimed = rows.claimed(
                        await (await conn.execute(sql, params)).fetchall(), token, queue
                    )
                spent = len(claimed.jobs)
                if spent and any(lock.per_second is not None for lock in locked):
                    read_at = max(lock.read_at for lock in locked)
                    await conn.execute(
                        query("flow_gate_spend"), {**keys, "spent": spent, "read_at": read_at}
                    )
            # Recorded once committed: a claim rolled back is claimed again, and would count twice.
            if claimed.jobs:
                JOB_STATS.waited(queue, claimed.waited_s)
            if claimed.stale:
                return claimed
            # Held back only if the limit cut a claim that had more to take: not when the jobs ran
            # out.
            if allowed is None or allowed >= limit or (asked > 0 and claimed.selected < asked):
                return replace(claimed, allowed=allowed)
            waits = [
                next_token_s(lock.tokens, spent, lock.per_second)
                for lock in locked
                if lock.per_second is not None and lock.tokens is not None
            ]
            wait_s = max(waits) if held_by == "per_second" and waits else None
            return replace(claimed, allowed=allowed, held_by=held_by, wait_s=wait_s)

        return await self.run("claim", work)

    def note_ready(self, queue: str | None, bucket: int | None = None) -> None:
        """A NOTIFY or a due timer says `bucket` of `queue` (None: any) may have work: on a
        distributed table, the next claim visits it even if it was found empty just now."""
        if self.sharded is not None:
            self.sharded.ready(queue, bucket)

    async def flow_state(self) -> FlowState:
        """The flow-control tables, in one snapshot (flow_state)."""
        cur = await self._execute("flow_state", query("flow_state"), {})
        row = await cur.fetchone()
        assert row is not None
        return rows.flow_state(row)

    async def jobs_next_due_in(self, queue: str, buckets: Sequence[int] | None) -> float | None:
        """Seconds (database clock) until the earliest not-yet-due queued job of `queue` in
        `buckets` (None: any bucket); None if there is none."""
        sharded = await self._placement()
        if sharded is not None:
            return await sharded.next_due_in(queue, buckets)
        params = {"queue": queue, "buckets": None if buckets is None else int_array(buckets)}
        cur = await self._execute("next_due", query("jobs_next_due_in"), params)
        due_in_s = rows.value(await cur.fetchone())
        return None if due_in_s is None else float(due_in_s)

    # -- finishing -----------------------------------------------------------------------------

    async def jobs_complete(
        self,
        ids: Sequence[int],
        tokens: Sequence[str],
        *,
        keyed: bool = False,
        buckets: Sequence[int] | None = None,
        results: Sequence[ResultText] | None = None,
        chain: Chain | None = None,
    ) -> Completion:
        """Mark jobs completed (with completed_jobs='delete', delete their rows; with 'archive',
        move them to the archive) where the token still matches: how many rows changed, and the
        ids refused (fenced: the token changed).
        `keyed`: some have an ordering key, whose next job is promoted in the same statement, or,
        if due and in one of `chain`'s buckets, claimed for this worker (up to chain.limit).
        `results`: each job's return value, written first (their rows are then kept, or
        archived). The children of completed jobs that have dependents are released next
        (_released)."""
        statements = self._complete_sql
        if results is not None:  # stored first; the rows are kept (archived under archive)
            statements = self._complete_result_sql
            params = {
                "ids": int_array(ids),
                "tokens": token_array(tokens),
                "results": [r.text for r in results],
                "errors": [r.error for r in results],
            }
            await self._execute("results", query("jobs_results_write"), params)
        sharded = await self._placement()
        if sharded is not None:  # (a cluster's completion keeps or deletes as completed_jobs says)
            return await self._released(await sharded.complete(ids, tokens, buckets, keyed=keyed))
        if not keyed:
            params = {
                "ids": int_array(ids),
                "tokens": token_array(tokens),
                "results_channel": RESULTS_CHANNEL,
            }
            cur = await self._execute("complete", statements[False], params)
            return await self._released(rows.completion_fenced(await cur.fetchone(), len(ids)))
        chain = chain or Chain()
        token = str(uuid.uuid4())
        keyed_params: dict[str, Any] = {
            "ids": int_array(ids),
            "tokens": token_array(tokens),
            "channel": NOTIFY_CHANNEL,
            "chain_queues": list(chain.queues),
            "chain_buckets": int_array(chain.buckets),
            "chain_limit": chain.limit,
            "token": token,
            "worker": self.worker_id,
            "lease_s": chain.lease_s,
            "results_channel": RESULTS_CHANNEL,
        }
        cur = await self._execute("complete", statements[True], keyed_params)
        done = rows.completion_keyed(await cur.fetchall(), token)
        for job, waited_s in zip(done.claimed, done.waited_s, strict=True):
            JOB_STATS.waited(job.queue, (waited_s,))
        return await self._released(done)

    async def _released(self, done: Completion) -> Completion:
        """`done`, once the children of its jobs that have dependents are released. A release
        that fails is not the completion's failure (that is written): the sweeper releases them."""
        await self._release_quietly(done.parents)
        return done

    async def _release_quietly(self, parents: Sequence[int]) -> None:
        if not parents:
            return
        try:
            await self.deps_release(parents)
        except StoreError as exc:
            metrics.STORE_ERRORS.labels("deps_release").inc()
            log.warning(
                "releasing the children of %d ended jobs failed (the dependency sweeper will): %s",
                len(parents),
                exc,
            )

    async def deps_release(self, parents: Sequence[int]) -> int:
        """Release the children of `parents`, which ended (db/dependencies.py): how many became
        queued. Idempotent: a parent whose edges are gone has nothing left to release."""
        return await self.run("deps_release", lambda conn: release_async(conn, parents))

    async def jobs_fail_owned(
        self, failures: Sequence[Failure], *, lease_expired: bool = False
    ) -> list[FailedWrite]:
        """Write failed attempts where the token still matches (and, for `lease_expired`, the
        lease is still expired); returns the rows written."""
        params = {
            "ids": int_array([f.id for f in failures]),
            "tokens": token_array([f.token for f in failures]),
            "statuses": [f.outcome.status for f in failures],
            "delays_s": [f.outcome.delay_s for f in failures],
            "errors": [f.outcome.error for f in failures],
            "halts": [f.halts for f in failures],
            "snoozes_s": [None if f.snooze is None else f.snooze[0] for f in failures],
            "snooze_caps": [None if f.snooze is None else f.snooze[1] for f in failures],
            "lease_expired": lease_expired,
            "channel": NOTIFY_CHANNEL,
            "errors_kept": ATTEMPT_ERRORS_KEPT,
            "error_chars": LAST_ERROR_MAX_CHARS,
            "results_channel": RESULTS_CHANNEL,
        }
        sharded = await self._placement()
        if sharded is not None:
            written = await sharded.fail(params, failures)
        else:
            cur = await self._execute("fail", query("jobs_fail_owned"), params)
            written = rows.typed(FailedWrite, await cur.fetchall())
        await self._release_quietly([w.id for w in written if w.releases])
        return written

    async def jobs_release_owned(self, jobs: Sequence[Job]) -> int:
        sharded = await self._placement()
        if sharded is not None:
            return await sharded.release(jobs, NOTIFY_CHANNEL)
        params = {
            "ids": int_array([j.id for j in jobs]),
            "tokens": token_array([j.token for j in jobs]),
            "channel": NOTIFY_CHANNEL,
        }
        cur = await self._execute("release", query("jobs_release_owned"), params)
        return int(rows.value(await cur.fetchone()) or 0)

    async def ordering_promote_scan(self, queue: str, after: str, limit: int) -> OrderingScan:
        """Promote the next job of keys of `queue` left with waiting jobs and no holder, up to
        `limit` keys after `after` (key order); StoreConflict if another promotion raced this
        one."""
        sharded = await self._placement()
        if sharded is not None:
            return await sharded.promote_scan(queue, limit)
        params = {"queue": queue, "after": after, "limit": limit, "channel": NOTIFY_CHANNEL}
        cur = await self._execute(
            "ordering_scan", query("ordering_promote_scan"), params, budget=SLOW_STATEMENT
        )
        return rows.typed_one(OrderingScan, await cur.fetchone()) or OrderingScan(None, 0, 0)

    async def history_record(self, history: HistoryRows) -> None:
        params = {
            "ids": int_array(history.ids),
            "attempts": history.attempts,
            "workers": history.workers,
            "started_at": history.started_at,
            "durations_ms": history.durations_ms,
            "outcomes": history.outcomes,
            "errors": history.errors,
        }
        await self._execute("history", query("history_record"), params)

    # -- leases --------------------------------------------------------------------------------

    async def jobs_extend_leases(self, jobs: Sequence[Job], lease_s: float) -> dict[int, bool]:
        """Extend the leases of `jobs` still ours; returns their ids, each with whether an
        operator asked to cancel it (a missing id: taken over)."""
        sharded = await self._placement()
        if sharded is not None:
            return await sharded.extend_leases(jobs, lease_s)
        params = {
            "ids": int_array([j.id for j in jobs]),
            "tokens": token_array([j.token for j in jobs]),
            "lease_s": lease_s,
        }
        cur = await self._execute("heartbeat", query("jobs_extend_leases"), params)
        return rows.lease_extensions(await cur.fetchall())

    async def jobs_report_progress(
        self, reports: Sequence[ProgressReport]
    ) -> list[ProgressWritten]:
        """Running jobs' progress and meta updates, fenced by their tokens (db/progress.py)."""
        return await report_progress(self._execute, await self._placement(), reports)

    async def ping(self) -> None:
        """One round trip: does this connection answer within the statement budget?"""
        await self._execute("ping", query("ping"), {})

    async def jobs_lease_expired(self, limit: int = 1000) -> list[ExpiredLease]:
        sharded = await self._placement()
        if sharded is not None:
            return await sharded.lease_expired(limit)
        cur = await self._execute("reap", query("jobs_lease_expired"), {"limit": limit})
        return rows.typed(ExpiredLease, await cur.fetchall())

    async def maintenance_lease_take(
        self, name: str, ttl_s: float, yielding: Sequence[str] = ()
    ) -> bool:
        """Take or renew the one-pod-at-a-time role `name` for `ttl_s` (database clock); True:
        ours. `yielding`: holders it may be taken from before their lease ends."""
        params = {
            "name": name,
            "holder": self.worker_id,
            "ttl_s": ttl_s,
            "yielding": list(yielding),
        }
        cur = await self._execute("lease_take", query("maintenance_lease_take"), params)
        return await cur.fetchone() is not None

    async def maintenance_lease_release(self, name: str) -> None:
        params = {"name": name, "holder": self.worker_id}
        await self._execute("lease_release", query("maintenance_lease_release"), params)
