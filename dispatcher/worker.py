"""The worker: a supervisor that wires the job's services, starts them, and owns the shutdown order.

The path of a job through one worker process:

    Producer.claim (one statement, a batch)  ->  Executor.start (handler on the loop or a thread)
        ->  outcome: completed, or RetryPolicy's decision on a failed attempt
        ->  Completer (one fenced statement per flush)
    and beside it: LeaseKeeper extends the leases of running jobs; if a worker dies or stalls,
    another worker's Reaper puts its jobs through the same RetryPolicy when their leases expire.

Shutdown (SIGTERM/SIGINT in the CLI), in this order:
1. stop claiming (a claim in flight finishes and its jobs start), and leave the coordination
   group, so our buckets move to the others at once while our jobs finish here;
2. give back claimed-but-unstarted jobs, uncounted;
3. let running jobs finish within the grace period, then interrupt them;
4. flush every outcome (shielded from cancellation), then close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.assignment import BucketAssignment

from . import metrics
from .completer import Completer
from .config import Config
from .constants import MODE_PARTITIONED
from .coordination import build_assignment
from .errors import ConfigError, StoreError
from .executor import Executor
from .listener import Listener
from .maintenance import LeaseKeeper, PeriodicService, PlannerStats, PressureSampler, Pruner, Reaper
from .producer import Producer
from .registry import Registry
from .retry import RetryPolicy
from .store import JobStore

log = logging.getLogger(__name__)

StoreFactory = Callable[[str, str, str], JobStore]  # (dsn, worker_id, application_name)


def _connect_store(dsn: str, worker_id: str, application_name: str) -> JobStore:
    return JobStore(dsn, worker_id, application_name=application_name)


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A snapshot of the services' counters."""

    claims: int
    claimed: int
    stolen: int
    steal_claims: int
    timeouts: int
    released: int
    reaped: int
    leases_lost: int


class Worker:
    def __init__(self, config: Config, registry: Registry, *, assignment: BucketAssignment | None = None,
                 store_factory: StoreFactory = _connect_store) -> None:
        if config.dsn is None:
            raise ConfigError("dsn", "is required to run a worker")
        self.config = config
        self.assignment = assignment or build_assignment(config)

        def store(role: str) -> JobStore:
            return store_factory(config.dsn, config.worker_id, f"dispatcher-{role}")  # type: ignore[arg-type]

        # One connection per loop: claims, completions, and the maintenance services together.
        claims, completions, maint = store("claim"), store("complete"), store("maint")
        self._stores = (claims, completions, maint)
        self._maintenance_store = maint
        policy = RetryPolicy(config.retry_base_s, config.retry_cap_s)
        self.completer = Completer(completions, flush_interval_s=config.flush_interval_s,
                                   flush_max=config.flush_max, history=config.history)
        self.executor = Executor(registry, policy, self.completer, worker_id=config.worker_id,
                                 job_timeout_s=config.job_timeout_s, sync_threads=config.sync_threads)
        self.producer = Producer(config, claims, self.assignment, self.executor)
        self._listener = Listener(config.dsn, set(config.queues), self.producer.on_notify)
        self.lease_keeper = LeaseKeeper(maint, self.executor, lease_s=config.lease_s, interval_s=config.heartbeat_s)
        self.reaper = Reaper(maint, policy, interval_s=config.reaper_interval_s, history=config.history,
                             on_reaped=self.producer.wake)
        self._services: list[PeriodicService] = [
            self.lease_keeper, self.reaper,
            Pruner(maint, retention_s=config.completed_retention_s, interval_s=config.prune_interval_s),
            PlannerStats(maint, interval_s=config.reaper_interval_s),
            PressureSampler(maint, interval_s=config.reaper_interval_s),
        ]
        self._stop = asyncio.Event()
        self._grace_override: float | None = None
        self._released = 0
        self.started = asyncio.Event()  # test signal: every service is up

    @property
    def listening(self) -> asyncio.Event:
        """Test signal: set while LISTEN is active (wake-ups by NOTIFY work)."""
        return self._listener.listening

    @property
    def idle(self) -> bool:
        """Test signal: the claim loop sleeps with no wake-up pending (see Producer.idle)."""
        return self.producer.idle

    @property
    def stats(self) -> WorkerStats:
        p = self.producer.stats
        return WorkerStats(p.claims, p.claimed, p.stolen, p.steal_claims, self.executor.stats.timeouts,
                           self._released, self.reaper.reaped, self.lease_keeper.leases_lost)

    async def run(self) -> None:
        await self.assignment.start(on_revoke=self.producer.on_revoke)
        await self._listener.start()
        background = [asyncio.create_task(self.completer.run(), name="completer")]
        background += [asyncio.create_task(s.run(), name=s.name) for s in self._services]
        producer = asyncio.create_task(self.producer.run(), name="producer")
        self.started.set()
        owned = self.assignment.owned()
        log.info("worker %s running: mode=%s queues=%s concurrency=%d buckets=%s", self.config.worker_id,
                 self.config.mode, ",".join(self.config.queues), self.config.concurrency,
                 "all" if self.config.mode != MODE_PARTITIONED else _fmt_buckets(owned))
        try:
            await self._stop.wait()
        finally:
            await asyncio.shield(self._shutdown(producer, background))

    def stop(self, *, grace_s: float | None = None) -> None:
        """Begin a graceful shutdown (idempotent; call from a signal handler)."""
        if grace_s is not None:
            self._grace_override = grace_s
        self._stop.set()

    async def _shutdown(self, producer: asyncio.Task[None], background: list[asyncio.Task[None]]) -> None:
        # 1. Stop claiming (never mid-statement: a claim in flight finishes and its jobs start),
        #    and leave the group, so our buckets move now, not after the grace period.
        self.producer.stop()
        self.executor.stop_starting()
        await asyncio.gather(producer, return_exceptions=True)
        await self.assignment.stop()
        # 2. Claimed but never started: back to the queue at once, the attempt not counted.
        await self._release_unstarted()
        # 3. Running jobs get the grace period, then are interrupted (retried at once elsewhere).
        grace = self._grace_override if self._grace_override is not None else self.config.shutdown_grace_s
        await self.executor.drain(grace)
        # 4. Every outcome reaches the database before we close.
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self._flush_until_done()
        await self._listener.stop()
        self.executor.close()
        for store in self._stores:
            await store.close()
        log.info("worker %s stopped: %s %s", self.config.worker_id, self.stats, self.completer.stats)

    async def _release_unstarted(self) -> None:
        unstarted = self.executor.take_unstarted()
        if not unstarted:
            return
        for attempt in range(5):
            try:
                released = await self._maintenance_store.jobs_release_owned(unstarted)
            except StoreError as exc:
                log.warning("release of unstarted jobs failed (try %d): %s", attempt + 1, exc)
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            self._released += released
            metrics.JOBS_RELEASED.inc(released)
            log.info("released %d claimed-but-unstarted jobs", released)
            return
        log.error("could not release %d unstarted jobs; their leases will bring them back", len(unstarted))

    async def _flush_until_done(self) -> None:
        for attempt in range(10):
            try:
                await self.completer.flush()
                return
            except StoreError as exc:
                log.warning("final flush failed (try %d): %s", attempt + 1, exc)
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        log.error("gave up flushing %d outcomes; their leases will bring the jobs back", self.completer.pending)


def _fmt_buckets(buckets: tuple[int, ...] | None) -> str:
    if buckets is None:
        return "none yet (degraded: SKIP LOCKED)"
    return ",".join(map(str, buckets)) if len(buckets) < 12 else f"{len(buckets)} buckets"


def run_worker(config: Config, registry: Registry, *, install_signals: bool = True,
               on_started: Callable[[Worker], None] | None = None) -> Worker:
    """Run a worker on uvloop until SIGTERM/SIGINT; a second signal skips the grace period."""
    import signal

    import uvloop

    worker = Worker(config, registry)

    async def main() -> None:
        if install_signals:
            loop = asyncio.get_running_loop()
            signals_seen = 0

            def on_signal(signum: int) -> None:
                nonlocal signals_seen
                signals_seen += 1
                log.info("received %s: %s", signal.Signals(signum).name,
                         "stopping gracefully" if signals_seen == 1 else "skipping the grace period")
                worker.stop(grace_s=0.0 if signals_seen > 1 else None)

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal, sig)
        if on_started is not None:
            on_started(worker)
        await worker.run()

    uvloop.run(main())
    return worker
