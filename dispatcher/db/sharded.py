"""The job store's hot statements when the jobs table is distributed by bucket (Citus): one
statement per bucket, so each is a router query on the one node holding that bucket's shard.

A claim visits the caller's buckets (all 64 in skip_locked mode) from a rotating start until it
has its jobs; a completion, failure, release or lease extension is grouped by bucket; the reaper
and the next-due probe visit the buckets in turn. Texts: sql/sharded.sql, and the single-node
writes with the bucket pinned (`pinned`). Why and what it costs: docs/concepts/citus.md.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import psycopg

from dispatcher.constants import NUM_BUCKETS
from dispatcher.db import rows, sharded_admin
from dispatcher.db.claims import check_buckets, claim_params, type_filter
from dispatcher.db.completions import archiving
from dispatcher.db.literals import int_array, token_array
from dispatcher.db.queries import query
from dispatcher.db.rows import Claimed, ExpiredLease, FailedWrite, Failure, TypeFilter
from dispatcher.errors import StoreConflict
from dispatcher.model import Job

Execute = Callable[[str, str, dict[str, Any]], Awaitable[psycopg.AsyncCursor[Any]]]

# Every single-node write by ids reads its rows through this clause; pinned, it names the bucket.
_BY_IDS: Final = "WHERE j.id = ANY(%(ids)s::bigint[])"
_BY_BUCKET_AND_IDS: Final = (
    "WHERE j.bucket = %(bucket)s::smallint AND j.id = ANY(%(ids)s::bigint[])"
)
# A bucket whose claim found nothing is skipped by later claims for this long, or until a NOTIFY
# or a due timer says it has work (`ready`): without it, every wake-up of a worker that owns many
# buckets sent a statement to each of them. A NOTIFY that was missed costs at most this much.
DRY_S: Final = 1.0


def pinned(text: str) -> str:
    """A single-node write by ids, limited to one bucket (%(bucket)s) so Citus routes it."""
    if _BY_IDS not in text:
        raise ValueError("a write to pin must select its rows by `j.id = ANY(%(ids)s)`")
    # A key's next job is in the key's bucket: its promotion is pinned too (no NOTIFY inside).
    text = text.replace(query("ordering_promote_next"), query("sharded_promote_next"))
    return text.replace(_BY_IDS, _BY_BUCKET_AND_IDS)


def keyed_completion_text(completion: str, *, archive: bool = False) -> str:
    """jobs_complete_keyed_bucket around `completion` (jobs_complete_owned, or its delete; with
    `archive`, the delete whose rows go to the archive in the same statement)."""
    text = query("jobs_complete_keyed_bucket").replace("{completion}", completion)
    text = text.replace("{promote}", query("sharded_promote_next"))
    return pinned(archiving(text) if archive else text)


def claim_text(types: TypeFilter | None, *, skip_locked: bool) -> str:
    text = query("jobs_claim_bucket").replace(
        "{lock}", "FOR UPDATE SKIP LOCKED" if skip_locked else ""
    )
    return text.replace("{type_filter}", type_filter(types))


def by_bucket(buckets: Iterable[int]) -> dict[int, list[int]]:
    """The positions of each bucket's items: {bucket: [index, ...]}, in the given order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, bucket in enumerate(buckets):
        groups[bucket].append(i)
    return groups


def failure_bucket(failure: Failure) -> int | None:
    if failure.bucket is not None:
        return failure.bucket
    return None if failure.job is None else failure.job.bucket


class ShardedStatements:
    """The per-bucket loops, over the store's `execute` (one bounded statement each)."""

    def __init__(
        self,
        execute: Execute,
        worker_id: str,
        completion: str,
        channel: str,
        *,
        archive: bool = False,
    ) -> None:
        self._execute = execute
        self._worker_id = worker_id
        self._channel = channel
        # `completion`: jobs_complete_owned or its delete, per DISPATCHER_COMPLETED_JOBS; with
        # `archive` (the delete), the deleted rows go to the archive in the same statement.
        fenced = query("sharded_complete_fenced").replace("{completion}", completion)
        self._complete_sql = pinned(archiving(fenced) if archive else fenced)
        self._closes_windows = completion == query("jobs_complete_owned_delete")
        self._keyed_sql = keyed_completion_text(completion, archive=archive)
        self._scan_sql = query("ordering_promote_scan_bucket").replace(
            "{promote}", query("sharded_promote_next")
        )
        self._fail_sql = pinned(query("jobs_fail_owned"))
        self._release_sql = pinned(query("jobs_release_owned"))
        self._extend_sql = pinned(query("jobs_extend_leases"))
        self._cancel_sql: str | None = None  # made at the first cancel (cancel)
        self._claim_sql: dict[tuple[bool | None, bool], str] = {}
        self._start = 0  # where the next visit of the buckets begins: each gets its turn first
        # (queue, bucket, the claim's type filter) -> time.monotonic(): a bucket with no job of
        # the types one claim takes may have jobs of the types another (a gated claim) takes.
        self._dry_until: dict[tuple[str, int, TypeFilter | None], float] = {}

    def ready(self, queue: str | None, bucket: int | None) -> None:
        """`bucket` of `queue` may have work now (None: any bucket, or any queue)."""
        for key in [
            k
            for k in self._dry_until
            if queue is None or (k[0] == queue and (bucket is None or k[1] == bucket))
        ]:
            del self._dry_until[key]

    def _rotated(self, buckets: Sequence[int]) -> list[int]:
        ordered = sorted(set(buckets))
        self._start = (self._start + 1) % max(1, len(ordered))
        return ordered[self._start :] + ordered[: self._start]

    async def claim(
        self,
        queue: str,
        limit: int,
        lease_s: float,
        buckets: Sequence[int] | None,
        types: TypeFilter | None,
        flow_version: int | None,
        *,
        execute: Execute | None = None,
    ) -> Claimed:
        """Up to `limit` jobs from `buckets` (None: every bucket, with SKIP LOCKED), one bucket per
        statement, under one token. Stops at the first bucket that says the flow-control tables
        changed (stale), and as soon as it has `limit` jobs. `execute`: another way to send each
        statement (a gated claim's, inside its transaction)."""
        execute = execute or self._execute
        skip_locked = buckets is None
        if buckets is not None:
            check_buckets(buckets)
        key = (None if types is None else types.include, skip_locked)
        sql = self._claim_sql.get(key)
        if sql is None:
            sql = self._claim_sql[key] = claim_text(types, skip_locked=skip_locked)
        token = str(uuid.uuid4())
        jobs: list[Job] = []
        waited_s: list[float] = []
        selected = 0
        now = time.monotonic()
        for bucket in self._rotated(range(NUM_BUCKETS) if buckets is None else buckets):
            if self._dry_until.get((queue, bucket, types), 0.0) > now:
                continue
            params = claim_params(
                queue, limit - len(jobs), lease_s, self._worker_id, token, flow_version, types
            )
            params["bucket"] = bucket
            cur = await execute("claim", sql, params)
            got = rows.claimed(await cur.fetchall(), token, queue)
            if got.stale:
                return Claimed(jobs, selected, stale=not jobs, waited_s=waited_s)
            jobs.extend(got.jobs)
            waited_s.extend(got.waited_s)
            selected += got.selected
            if got.selected == 0:
                self._dry_until[(queue, bucket, types)] = now + DRY_S
            if len(jobs) >= limit:
                break
        return Claimed(jobs, selected, waited_s=waited_s)

    @staticmethod
    async def running_under(
        conn: psycopg.AsyncConnection[Any], locks: Sequence[rows.LimitLock]
    ) -> list[int]:
        """How many jobs run now under each of `locks` ('*': any type or queue): flow_gate_running
        over every shard, as one grouped count (the limits span buckets: a fan-out, not a
        router query), matched to the rows here."""
        cur = await conn.execute(query("sharded_running_by_type"))
        counts: list[tuple[str, str, int]] = await cur.fetchall()
        return [
            sum(
                n
                for job_type, queue, n in counts
                if lock.job_type in ("*", job_type) and lock.queue in ("*", queue)
            )
            for lock in locks
        ]

    async def next_due_in(self, queue: str, buckets: Sequence[int] | None) -> float | None:
        soonest: float | None = None
        for bucket in range(NUM_BUCKETS) if buckets is None else sorted(set(buckets)):
            params = {"queue": queue, "bucket": bucket}
            cur = await self._execute("next_due", query("jobs_next_due_in_bucket"), params)
            due_in_s = rows.value(await cur.fetchone())
            if due_in_s is not None and (soonest is None or float(due_in_s) < soonest):
                soonest = float(due_in_s)
        return soonest

    async def wake(self, bucket: int, queues: Sequence[str]) -> None:
        """Wake the owners of `bucket` of `queues`: jobs were promoted there (sharded_wake)."""
        if queues:
            params = {"channel": self._channel, "bucket": bucket, "queues": list(queues)}
            await self._execute("wake", query("sharded_wake"), params)

    async def complete(
        self,
        ids: Sequence[int],
        tokens: Sequence[str],
        buckets: Sequence[int] | None,
        *,
        keyed: bool,
    ) -> rows.Completion:
        """Completed bucket by bucket; with `keyed`, each released key's next job is promoted in
        the same statement and its bucket's owner woken (no job is chained to this worker)."""
        if buckets is None:
            buckets = await self._buckets_of(ids)
        changed = 0
        fenced: list[int] = []
        windowed: list[int] = []  # finished jobs with a uniqueness window
        parents: list[int] = []  # finished jobs with dependents (released next by the store)
        for bucket, at in by_bucket(buckets).items():
            params = {
                "ids": int_array([ids[i] for i in at]),
                "tokens": token_array([tokens[i] for i in at]),
                "bucket": bucket,
            }
            if not keyed:
                cur = await self._execute("complete", self._complete_sql, params)
                row = await cur.fetchone()
                assert row is not None  # one row, always
                done = rows.completion_fenced(row[:1], len(at))
                changed += done.completed
                fenced.extend(done.fenced)
                windowed.extend(row[1])
                parents.extend(row[2])
                continue
            cur = await self._execute("complete", self._keyed_sql, params)
            row = await cur.fetchone()
            assert row is not None  # one row, always
            completed, promoted, refused, queues, with_windows, with_dependents = row
            changed += int(completed)
            fenced.extend(refused)
            windowed.extend(with_windows)
            parents.extend(with_dependents)
            if promoted:
                await self.wake(bucket, queues)
        if windowed and self._closes_windows:
            params = {"ids": int_array(windowed)}
            await self._execute("complete", query("sharded_windows_close"), params)
        return rows.Completion(changed, fenced, parents=parents)

    async def _buckets_of(self, ids: Sequence[int]) -> list[int]:
        """Each job's bucket, read from the table; a job that is not there gets bucket 0, where
        a write pinned to it finds nothing (as for a job deleted meanwhile)."""
        cur = await self._execute("buckets", query("sharded_buckets_of"), {"ids": int_array(ids)})
        found = dict(await cur.fetchall())
        return [int(found.get(i, 0)) for i in ids]

    async def promote_scan(self, queue: str, limit: int) -> rows.OrderingScan:
        """ordering_promote_scan over every bucket in turn, up to `limit` keys in each: one whole
        pass (last_key None)."""
        scanned = promoted = 0
        for bucket in range(NUM_BUCKETS):
            params = {"queue": queue, "after": "", "limit": limit, "bucket": bucket}
            cur = await self._execute("ordering_scan", self._scan_sql, params)
            page = rows.typed_one(rows.OrderingScan, await cur.fetchone())
            if page is not None:
                scanned += page.scanned
                promoted += page.promoted
                if page.promoted:
                    await self.wake(bucket, [queue])
        return rows.OrderingScan(None, scanned, promoted)

    async def fail(self, params: dict[str, Any], failures: Sequence[Failure]) -> list[FailedWrite]:
        """jobs_fail_owned's `params` (lists: one item per failure), sent bucket by bucket."""
        arrays = [k for k, v in params.items() if isinstance(v, list)]
        written: list[FailedWrite] = []
        missing = [f.id for f in failures if failure_bucket(f) is None]
        found = dict(zip(missing, await self._buckets_of(missing), strict=True)) if missing else {}
        placed = [found[f.id] if (b := failure_bucket(f)) is None else b for f in failures]
        for bucket, at in by_bucket(placed).items():
            one = {**params, **{k: [params[k][i] for i in at] for k in arrays}, "bucket": bucket}
            one["ids"] = int_array([failures[i].id for i in at])
            one["tokens"] = token_array([failures[i].token for i in at])
            cur = await self._execute("fail", self._fail_sql, one)
            some = rows.typed(FailedWrite, await cur.fetchall())
            written.extend(some)
            # A keyed job that ended released its key, whose next job may now be queued.
            released = {
                w.queue
                for w in some
                if w.queue is not None and w.status != "queued" and not w.ordering_halted
            }
            keyed = any(
                f.job is None or f.job.ordering_key is not None for f in (failures[i] for i in at)
            )
            if released and keyed:
                await self.wake(bucket, sorted(released))
        return written

    async def release(self, jobs: Sequence[Job], channel: str) -> int:
        released = 0
        for bucket, at in by_bucket([j.bucket for j in jobs]).items():
            some = [jobs[i] for i in at]
            params = {
                "ids": int_array([j.id for j in some]),
                "tokens": token_array([j.token for j in some]),
                "channel": channel,
                "bucket": bucket,
            }
            cur = await self._execute("release", self._release_sql, params)
            row = await cur.fetchone()
            assert row is not None  # one row, always
            released += int(row[0] or 0)
            if row[1]:
                await self.wake(bucket, sorted({j.queue for j in some}))
        return released

    async def extend_leases(self, jobs: Sequence[Job], lease_s: float) -> dict[int, bool]:
        kept: dict[int, bool] = {}
        for bucket, at in by_bucket([j.bucket for j in jobs]).items():
            some = [jobs[i] for i in at]
            params = {
                "ids": int_array([j.id for j in some]),
                "tokens": token_array([j.token for j in some]),
                "lease_s": lease_s,
                "bucket": bucket,
            }
            cur = await self._execute("heartbeat", self._extend_sql, params)
            kept.update(rows.lease_extensions(await cur.fetchall()))
        return kept

    async def lease_expired(self, limit: int) -> list[ExpiredLease]:
        expired: list[ExpiredLease] = []
        for bucket in self._rotated(range(NUM_BUCKETS)):
            params = {"bucket": bucket, "limit": limit - len(expired)}
            cur = await self._execute("reap", query("jobs_lease_expired_bucket"), params)
            expired.extend(rows.typed(ExpiredLease, await cur.fetchall()))
            if len(expired) >= limit:
                break
        return expired

    async def cancel(self, ids: Sequence[int]) -> dict[int, str]:
        """JobStore.jobs_cancel, bucket by bucket (sharded_admin.pin_write): each job's status
        after it; the keys a bucket's cancel released get their next job there."""
        if self._cancel_sql is None:
            text = query("admin_jobs_cancel").replace("{filters}", "true")
            self._cancel_sql = sharded_admin.pin_write(text)
        cur = await self._execute("cancel", query("db_now"), {})
        now = rows.value(await cur.fetchone())
        after: dict[int, str] = {}
        for bucket, at in by_bucket(await self._buckets_of(ids)).items():
            params = {"ids": int_array([ids[i] for i in at]), "bucket": bucket, "now": now}
            cur = await self._execute("cancel", self._cancel_sql, params)
            written = rows.typed(rows.WrittenJob, await cur.fetchall())
            after.update({w.id: w.status for w in written if w.status is not None})
            released = rows.released_keys(written, ["cancelled"])
            if released:
                await self._promote_keys(bucket, released)
        return after

    async def _promote_keys(self, bucket: int, keys: Sequence[tuple[str, str]]) -> None:
        """sharded_promote_keys for `keys` of `bucket`, then its owners woken. Another promotion
        of a key racing this one (StoreConflict) has its next job, or the sweeper gives it one."""
        params = {"queues": [q for q, _ in keys], "keys": [k for _, k in keys], "bucket": bucket}
        with contextlib.suppress(StoreConflict):
            cur = await self._execute("cancel", query("sharded_promote_keys"), params)
            row = await cur.fetchone()
            if row is not None and row[0]:
                await self.wake(bucket, row[1])
