"""The dashboard charts' data: each worker's stats flusher adds what this process counted per queue
(observe/job_metrics.py JOB_STATS: outcomes, queue waits) to its rows of the current minute every
few seconds, and one pod's rollup (the `stats` maintenance lease) moves closed minutes into the
per-minute table, samples each queue's depth and deletes minutes older than 7 days
(docs/design/dashboard.md, "Charts: the per-minute rollup"). No statement on a job's path: a job
costs the in-memory counts it already had.

JOB_STATS is process-wide, and several workers may run in one process (tests, an embedded worker
beside an application): the baseline of what was written is process-wide too, and one flush at a
time takes the delta from it, so every count is written once whichever worker writes it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.backoff import jittered
from dispatcher.db.literals import int_array
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.queries import query
from dispatcher.db.rows import QueueDepth
from dispatcher.db.store import SLOW_STATEMENT, JobStore
from dispatcher.observe.job_metrics import JOB_STATS, JobStats

log = logging.getLogger(__name__)

# What a chart counts as a failed attempt: every attempt that ended in an error, whether it is
# retried or not (a job that fails twice and then completes shows 2 failed and 1 finished).
# Cancelled and snoozed attempts are neither.
FAILED_OUTCOMES = ("retried", "failed", "discarded")
FINISHED_OUTCOMES = ("completed",)
KEEP_S = 7 * 24 * 3600  # per-minute rows kept
FINAL_FLUSH_S = 2.0  # the shutdown's last flush waits this long at most


@dataclass(slots=True)
class QueueCounts:
    """One queue's counts: totals since the process started, or a delta between two of them."""

    finished: int = 0
    failed: int = 0
    waits: list[int] = field(default_factory=list)  # per bucket of WAIT_BUCKETS_S, + overflow
    wait_sum_s: float = 0.0

    def minus(self, before: QueueCounts | None) -> QueueCounts:
        if before is None:
            return QueueCounts(self.finished, self.failed, list(self.waits), self.wait_sum_s)
        waits = [
            n - (before.waits[i] if i < len(before.waits) else 0) for i, n in enumerate(self.waits)
        ]
        return QueueCounts(
            self.finished - before.finished,
            self.failed - before.failed,
            waits,
            self.wait_sum_s - before.wait_sum_s,
        )

    @property
    def empty(self) -> bool:
        return not (self.finished or self.failed or any(self.waits))


def totals(stats: JobStats) -> dict[str, QueueCounts]:
    """Per queue, what `stats` counted since the process started (copied: the event loop goes on
    counting)."""
    n_waits = len(stats.wait_bounds_s) + 1
    out: dict[str, QueueCounts] = {}
    for (queue, _job_type), _buckets, _sum, outcomes, _timeouts in stats.snapshot():
        counts = out.setdefault(queue, QueueCounts(waits=[0] * n_waits))
        counts.finished += sum(outcomes[o] for o in FINISHED_OUTCOMES)
        counts.failed += sum(outcomes[o] for o in FAILED_OUTCOMES)
    for queue, buckets, sum_s in stats.wait_snapshot():
        counts = out.setdefault(queue, QueueCounts(waits=[0] * n_waits))
        counts.waits = buckets
        counts.wait_sum_s = sum_s
    return out


class Baseline:
    """What has been written of one JobStats: the totals at the last flush that succeeded.
    `take` gives the delta since, or None while another flush of the same stats is writing; the
    new baseline counts only once `commit` says the write succeeded, so a failed flush's counts go
    with the next one."""

    def __init__(self, stats: JobStats) -> None:
        self.stats = stats
        self.written: dict[str, QueueCounts] = {}
        self._writing = threading.Lock()  # several workers' loops may flush one process's stats

    def take(self) -> tuple[dict[str, QueueCounts], dict[str, QueueCounts]] | None:
        """(the totals now, their delta since the baseline: non-empty queues only), holding the
        writer's turn until commit or abandon; None if another flush holds it."""
        if not self._writing.acquire(blocking=False):
            return None
        now = totals(self.stats)
        delta = {q: c.minus(self.written.get(q)) for q, c in now.items()}
        return now, {q: c for q, c in delta.items() if not c.empty}

    def commit(self, now: dict[str, QueueCounts]) -> None:
        self.written = now
        self._writing.release()

    def abandon(self) -> None:
        self._writing.release()


_BASELINES: dict[int, Baseline] = {}
_BASELINES_LOCK = threading.Lock()


def baseline_of(stats: JobStats) -> Baseline:
    """The one baseline of `stats` in this process."""
    with _BASELINES_LOCK:
        found = _BASELINES.get(id(stats))
        if found is None or found.stats is not stats:
            found = _BASELINES[id(stats)] = Baseline(stats)
        return found


def flush_params(worker_id: str, delta: dict[str, QueueCounts]) -> dict[str, Any]:
    queues = sorted(delta)
    return {
        "worker_id": worker_id,
        "queues": queues,
        "finished": [delta[q].finished for q in queues],
        "failed": [delta[q].failed for q in queues],
        "waits": [int_array(delta[q].waits) for q in queues],
        "wait_sums": [delta[q].wait_sum_s for q in queues],
    }


class StatsFlusher(PeriodicService):
    """Every worker: its process's counts since the last flush, added to the per-worker table."""

    name = "stats_flush"
    INTERVAL_S = 5.0

    def __init__(
        self,
        store: JobStore,
        *,
        interval_s: float = INTERVAL_S,
        stats: JobStats = JOB_STATS,
        limits: ConnectionLimits | None = None,
    ) -> None:
        super().__init__(store, interval_s)
        self._baseline = baseline_of(stats)
        self._statement_s = (limits or ConnectionLimits()).statement_timeout_s  # the store's
        self.flushes = 0  # statements written (for tests)

    async def tick(self) -> float | None:
        await self.flush()
        return None

    async def flush(self) -> bool:
        """One flush; False if there was nothing to write or another flush of the process was
        writing (its delta holds ours). StoreError: nothing counted as written."""
        taken = self._baseline.take()
        if taken is None:
            return False
        now, delta = taken
        try:
            if delta:
                await self._store.run("stats_flush", self._writer(delta))
                self.flushes += 1
        except BaseException:
            self._baseline.abandon()
            raise
        self._baseline.commit(now)
        return bool(delta)

    def _writer(
        self, delta: dict[str, QueueCounts]
    ) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
        params = flush_params(self._store.worker_id, delta)
        # half the client's bound (store.run's): the server ends an overrun, not the client
        bound = {"statement": f"{max(1, int(self._statement_s * 500))}ms"}

        async def write(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction():
                await conn.execute(query("stats_flush_bound"), bound)
                await conn.execute(query("stats_flush"), params)

        return write

    async def final_flush(self, timeout_s: float = FINAL_FLUSH_S) -> None:
        """The shutdown's last flush (after the last outcomes were written), bounded: what it
        cannot write in time is lost, a few seconds of counts."""
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except Exception as exc:  # StoreError, TimeoutError: the worker stops all the same
            log.warning("the last flush of the chart counts failed: %s", exc)


@dataclass(frozen=True, slots=True)
class Rollup:
    minutes: int  # (minute, queue) rows the workers' rows were added to
    sampled: int  # queues with queued jobs (those seen within the hour without any: 0)


class StatsRollup(PeriodicService):
    """One pod at a time (the `stats` maintenance lease): closed minutes into the per-minute
    table, each queue's depth for the current minute, and the retention, in one transaction."""

    name = "stats_rollup"
    INTERVAL_S = 60.0
    LEASE_NAME = "stats"
    LEASE_INTERVALS = 3

    def __init__(
        self,
        store: JobStore,
        *,
        interval_s: float = INTERVAL_S,
        keep_s: float = KEEP_S,
    ) -> None:
        super().__init__(store, interval_s)
        self.holding = False
        self.keep_s = keep_s
        self.rounds = 0  # rollups done (for tests)

    async def tick(self) -> float | None:
        self.holding = await self._store.maintenance_lease_take(
            self.LEASE_NAME, self.LEASE_INTERVALS * self.interval_s
        )
        if self.holding:
            await self.roll_up()
        return jittered(self.interval_s)

    async def roll_up(self) -> Rollup:
        # The depth first, in its own statement: on a Citus cluster it reads the distributed
        # jobs table, which a transaction that wrote the coordinator's local tables may not.
        depths: Sequence[QueueDepth] = await self._store.queue_depth()
        due = {d.queue: int(d.jobs) for d in depths if d.status == "queued"}
        params = {"queues": list(due), "depths": list(due.values())}

        async def work(conn: psycopg.AsyncConnection[Any]) -> Rollup:
            async with conn.transaction():
                moved = await conn.execute(query("stats_rollup"))
                minutes = len(await moved.fetchall())
                await conn.execute(query("stats_record_depth"), params)
                await conn.execute(query("stats_retention"), {"keep_s": self.keep_s})
            return Rollup(minutes, len(due))

        done = await self._store.run("stats_rollup", work, budget=SLOW_STATEMENT)
        self.rounds += 1
        return done

    async def release(self) -> None:
        """Give the lease up (shutdown): another pod rolls up at its next round."""
        if self.holding:
            self.holding = False
            await self._store.maintenance_lease_release(self.LEASE_NAME)
