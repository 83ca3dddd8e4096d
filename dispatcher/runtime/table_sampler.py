"""Table-wide figures (queue depth, oldest due job, table and session pressure, the live workers of
the worker registry), sampled by ONE pod.

The sampler role is a lease row of dispatcher_maintenance_leases on the database clock (no
session state: works through PgBouncer). Only the holder exports the table-wide series; every pod
exports `dispatcher_table_sampler` and `dispatcher_table_sample_age_seconds`.
"""

from __future__ import annotations

import logging
import math
import random
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric

from dispatcher.db import rows
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.queries import query
from dispatcher.db.rows import DbPressure, QueueDepth
from dispatcher.db.store import JobStore

log = logging.getLogger(__name__)

LEASE_NAME = "table_sampler"
LEASE_TICKS = 3  # the lease lasts this many intervals
STALE_TICKS = 3  # a sample older than this many intervals is not exported
# query queue_depth: every status but completed (throughput x retention rows; read it as a rate)
# and, for ordering keys, 'waiting' (behind an earlier job of its key). The row 'halted' (keys that
# a failed or discarded job halts) is a gauge of its own: those jobs are counted under their status.
DEPTH_STATUSES = ("queued", "scheduled", "running", "failed", "discarded", "cancelled", "waiting")
HALTED = "halted"
# queues remembered to export 0 for once they are empty (bounded: names come from enqueue)
_MAX_QUEUES = 1000


@dataclass(frozen=True, slots=True)
class WorkerCount:
    """workers_live_by_mode: the registry's live workers of one mode and coordinator."""

    mode: str
    coordinator: str
    live: int


@dataclass(frozen=True, slots=True)
class TableSample:
    depth: tuple[QueueDepth, ...]
    pressure: DbPressure | None  # None: no statistics row for the jobs table yet
    taken_at: float  # time.monotonic()
    workers: tuple[WorkerCount, ...] = ()


class TableSampler(PeriodicService):
    name = "table_sampler"

    def __init__(self, store: JobStore, *, interval_s: float, queues: Iterable[str] = ()) -> None:
        # First try within a second: a pod that starts alone exports its figures at once.
        super().__init__(store, interval_s, first_delay_s=random.uniform(0.0, min(1.0, interval_s)))
        self.lease_s = LEASE_TICKS * interval_s
        self._held_until: float | None = None  # time.monotonic(): the role is ours until then
        self._queues = dict.fromkeys(queues)  # ordered set: queues exported even when empty
        self.sample: TableSample | None = None
        self.samples = 0
        COLLECTOR.track(self)

    @property
    def holding(self) -> bool:
        held_until = self._held_until
        return held_until is not None and time.monotonic() < held_until

    def fresh_sample(self) -> TableSample | None:
        """The sample to export now: ours, held, and no older than STALE_TICKS intervals."""
        sample = self.sample
        if (
            sample is None
            or not self.holding
            or time.monotonic() - sample.taken_at > STALE_TICKS * self.interval_s
        ):
            return None
        return sample

    def queues(self) -> list[str]:
        return list(self._queues)

    async def tick(self) -> None:
        sent_at = time.monotonic()
        # A store error propagates (counted and logged by run()); the role then lapses on its own
        # at _held_until, and the sample goes stale: nothing outdated is exported.
        ours = await self._store.maintenance_lease_take(LEASE_NAME, self.lease_s)
        if not ours:
            if self._held_until is not None:
                log.info(
                    "table sampler: another worker holds the role now; this one stops exporting "
                    "the table-wide metrics"
                )
            self._held_until, self.sample = None, None
            return
        if self._held_until is None:
            log.info(
                "table sampler: this worker samples the table-wide metrics (lease %g s)",
                self.lease_s,
            )
        # counted from the send: never longer than the database's
        self._held_until = sent_at + self.lease_s
        depth = tuple(await self._store.queue_depth())
        pressure = await self._store.db_pressure()

        async def count_workers(conn: psycopg.AsyncConnection[Any]) -> list[WorkerCount]:
            cur = await conn.execute(query("workers_live_by_mode"))
            return rows.typed(WorkerCount, await cur.fetchall())

        workers = tuple(await self._store.run("workers_live_by_mode", count_workers))
        for row in depth:
            if row.queue not in self._queues and len(self._queues) < _MAX_QUEUES:
                self._queues[row.queue] = None
        self.sample = TableSample(depth, pressure, time.monotonic(), workers)
        self.samples += 1

    async def release(self) -> None:
        """Give the role up (shutdown): another pod takes it at its next tick."""
        if self._held_until is None:
            return
        self._held_until, self.sample = None, None
        await self._store.maintenance_lease_release(LEASE_NAME)
        log.info("table sampler: released the role")


class TableCollector:
    """Exports the table-wide series of the sampler that holds the role in this process (none if
    none does), and the role flag and sample age of every pod."""

    def __init__(self) -> None:
        self._samplers: weakref.WeakSet[TableSampler] = weakref.WeakSet()

    def track(self, sampler: TableSampler) -> None:
        self._samplers.add(sampler)

    def describe(self) -> Iterator[Metric]:
        return iter(_role_families(0, math.inf) + _table_families(None, []))

    def collect(self) -> Iterator[Metric]:
        samplers = list(self._samplers)
        holding = any(s.holding for s in samplers)
        fresh = [(sample, s) for s in samplers if (sample := s.fresh_sample()) is not None]
        ages = [
            time.monotonic() - s.sample.taken_at
            for s in samplers
            if s.holding and s.sample is not None
        ]
        families = _role_families(1 if holding else 0, min(ages, default=math.inf))
        if fresh:
            sample, sampler = max(fresh, key=lambda pair: pair[0].taken_at)
            families += _table_families(sample, sampler.queues())
        return iter(families)


def _role_families(holding: int, age_s: float) -> list[Metric]:
    return [
        GaugeMetricFamily(
            "dispatcher_table_sampler",
            "1 on the one worker that samples the table-wide metrics (holds the sampler lease)",
            value=holding,
        ),
        GaugeMetricFamily(
            "dispatcher_table_sample_age_seconds",
            "Age of this worker's table-wide sample; +Inf when it holds none (use min() over pods)",
            value=age_s,
        ),
    ]


def _table_families(sample: TableSample | None, queues: list[str]) -> list[Metric]:
    jobs = GaugeMetricFamily(
        "dispatcher_queue_jobs",
        "Jobs per queue and status: queued (due), scheduled (not due yet), running, failed, "
        "discarded, cancelled, waiting (behind an earlier job of its ordering key)",
        labels=["queue", "status"],
    )
    halted = GaugeMetricFamily(
        "dispatcher_queue_halted_keys",
        "Ordering keys per queue whose jobs wait behind a job that failed for good "
        "(dispatcher jobs list --halted)",
        labels=["queue"],
    )
    oldest = GaugeMetricFamily(
        "dispatcher_queue_oldest_runnable_age_seconds",
        "Age of the oldest due job waiting per queue (0 when none is due)",
        labels=["queue"],
    )
    dead = GaugeMetricFamily("dispatcher_db_dead_tuples", "Dead tuples in the jobs table")
    live = GaugeMetricFamily("dispatcher_db_live_tuples", "Live tuples in the jobs table")
    claim_reads = CounterMetricFamily(
        "dispatcher_db_claim_index_tuples_read",
        "Index entries read through the claim indexes (since the statistics reset)",
    )
    lock_waits = GaugeMetricFamily(
        "dispatcher_db_lock_waits", "Sessions of dispatcher workers waiting on a lock now"
    )
    active = GaugeMetricFamily(
        "dispatcher_db_active_sessions", "Sessions of this database running a statement now"
    )
    workers = GaugeMetricFamily(
        "dispatcher_workers",
        "Live workers of the worker registry per mode and coordinator, every pod's (0 for a pair "
        "whose workers all stopped or vanished within the hour)",
        labels=["mode", "coordinator"],
    )
    families: list[Metric] = [
        jobs,
        halted,
        oldest,
        dead,
        live,
        claim_reads,
        lock_waits,
        active,
        workers,
    ]
    if sample is None:
        return families
    for count in sample.workers:
        workers.add_metric([count.mode, count.coordinator], count.live)
    # each exported, 0 when empty
    known = dict.fromkeys([*queues, *(row.queue for row in sample.depth)])
    counts = {(q, s): 0 for q in known for s in DEPTH_STATUSES}
    ages = dict.fromkeys(known, 0.0)
    halted_keys = dict.fromkeys(known, 0)
    for row in sample.depth:
        if row.status == HALTED:
            halted_keys[row.queue] = row.jobs
            continue
        counts[(row.queue, row.status)] = row.jobs
        if row.status == "queued" and row.oldest_due_age_s is not None:
            ages[row.queue] = max(0.0, row.oldest_due_age_s)  # the clocks' rounding: never below 0
    for (queue, status), n in sorted(counts.items()):
        jobs.add_metric([queue, status], n)
    for queue, age_s in sorted(ages.items()):
        oldest.add_metric([queue], age_s)
    for queue, n in sorted(halted_keys.items()):
        halted.add_metric([queue], n)
    p = sample.pressure
    if p is not None:
        dead.add_metric([], p.n_dead_tup)
        live.add_metric([], p.n_live_tup)
        claim_reads.add_metric([], p.claim_idx_tup_read)
        lock_waits.add_metric([], p.lock_waits)
        active.add_metric([], p.active_sessions)
    return families


COLLECTOR = TableCollector()
REGISTRY.register(COLLECTOR)
