"""The worker: a supervisor that starts the job's services (built in wiring.py) and owns the
shutdown order.

A job's path: Producer.claim -> Executor.start -> outcome (or RetryPolicy's decision) -> Completer;
beside it the LeaseKeeper, and other workers' Reapers. Shutdown: stop claiming and leave the
groups, give back unstarted jobs, let running ones finish within the grace, flush, exit, all within
shutdown_grace_s + SHUTDOWN_OVERRUN_S (docs/concepts/failure-semantics.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from coordinator.assignment import BucketAssignment
from dispatcher.api.registry import Registry
from dispatcher.errors import ConfigError, StoreError
from dispatcher.model import PROGRESS_SINK
from dispatcher.observe import job_metrics, metrics
from dispatcher.runtime.completer import Completer
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.producer import Producer
from dispatcher.runtime.queue_stats import FINAL_FLUSH_S
from dispatcher.runtime.stuck import StuckWatch
from dispatcher.runtime.vitals import Vitals
from dispatcher.serve.lifecycle import EXIT_FORCED, EXIT_STUCK
from dispatcher.serve.wiring import RoleHolder, StoreFactory, build_services, connect_store
from dispatcher.settings.config import Config
from dispatcher.settings.sections import WorkerSettings

if TYPE_CHECKING:
    from dispatcher.serve.health import Health

log = logging.getLogger(__name__)

# After the grace period, handlers get this long to react to cancellation (async) or return
# (sync) while their leases are kept; then they are left to their leases.
INTERRUPT_WAIT_S = 2.0
# Everything after the grace period (the wait above, the final flush, leaving the group) ends
# within this; the process watchdog allows one second more.
SHUTDOWN_OVERRUN_S = 5.0
WATCHDOG_SLACK_S = 1.0


def exit_bound_s(settings: WorkerSettings) -> float:
    """From the first signal to the end of the process, at most (enforced by the watchdog)."""
    return settings.shutdown_grace_s + SHUTDOWN_OVERRUN_S + WATCHDOG_SLACK_S


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A snapshot of the services' counters."""

    claims: int
    claimed: int
    stolen: int
    steal_claims: int  # statements
    steals: int  # attempts (a sweep of statements, until one finds jobs)
    timeouts: int
    released: int
    reaped: int
    leases_lost: int  # taken over (a heartbeat found so) or run out (our own timer), together
    leases_ran_out: int  # of them: run out while heartbeats did not reach the database
    abandoned: int


class Worker:
    """Runs one worker's services (wiring.py) until stop(), then shuts them down in order, within
    its bound."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        *,
        assignments: Mapping[str, BucketAssignment] | None = None,
        store_factory: StoreFactory = connect_store,
        vitals: Vitals | None = None,
    ) -> None:
        if config.dsn is None:
            raise ConfigError("dsn", "is required to run a worker")
        self.config = config
        # Written by the services, read by the producer, the coordinators and the health probes.
        self.vitals = vitals if vitals is not None else Vitals()
        self.services = build_services(
            config,
            registry,
            self.vitals,
            on_give_up=self._give_up,
            assignments=assignments,
            store_factory=store_factory,
        )
        self.assignments = self.services.assignments
        self.vitals.coordinated = config.coordination.used
        self.vitals.assignments = tuple(self.services.distinct_assignments)
        self.on_give_up: Callable[[], None] | None = None  # run_worker: arms the exit deadline
        # why it gave up on stuck handlers: it then exits EXIT_STUCK
        self.gave_up: str | None = None
        self._never = asyncio.Event()  # `listening` without a listener: never set
        # dispatcher_jobs_running{queue}, until the shutdown untracks it
        job_metrics.COLLECTOR.track(self.executor, config.claims.queues)
        self._stop = asyncio.Event()
        self._stop_requested_at: float | None = None
        self._grace_override: float | None = None
        self._released = 0
        # jobs still running when shutdown ended: the process must not wait for them
        self.abandoned = 0
        self.unflushed = 0  # outcomes that could not be written before the deadline
        self.started = asyncio.Event()  # test signal: every service is up (also vitals.started)

    # The services the shutdown and the tests reach most.
    @property
    def completer(self) -> Completer:
        return self.services.completer

    @property
    def executor(self) -> Executor:
        return self.services.executor

    @property
    def producer(self) -> Producer:
        return self.services.producer

    @property
    def stuck_watch(self) -> StuckWatch:
        return self.services.stuck_watch

    @property
    def listening(self) -> asyncio.Event:
        """Test signal: set while LISTEN is active (wake-ups by NOTIFY work); never with
        listen_dsn=none."""
        listener = self.services.listener
        return self._never if listener is None else listener.listening

    @property
    def stopping(self) -> asyncio.Event:
        """Set once stop() was called."""
        return self._stop

    @property
    def idle(self) -> bool:
        """Test signal: the claim loop sleeps with no wake-up pending (see Producer.idle)."""
        return self.producer.idle

    @property
    def stats(self) -> WorkerStats:
        p = self.producer.stats
        return WorkerStats(
            p.claims,
            p.claimed,
            p.stolen,
            p.steal_claims,
            p.steals,
            self.executor.stats.timeouts,
            self._released,
            self.services.reaper.reaped,
            self.executor.stats.leases_taken_over + self.executor.stats.leases_ran_out,
            self.executor.stats.leases_ran_out,
            self.abandoned,
        )

    @property
    def exit_code(self) -> int:
        """What the process exits with after run(): 0 clean, EXIT_STUCK, else EXIT_FORCED."""
        return EXIT_STUCK if self.gave_up else 0 if self.clean else EXIT_FORCED

    @property
    def clean(self) -> bool:
        """After run(): every job we held got its outcome written (or was given back)."""
        return self.abandoned == 0 and self.unflushed == 0

    async def run(self) -> None:
        # Handlers report progress to this worker's flusher: set once here, in the context every
        # task started below (and each handler's, started from theirs) copies.
        PROGRESS_SINK.set(self.services.progress)
        # Join the coordination groups beside everything else: until a queue's coordinator has
        # adopted its first view, its owned() is None and we claim with SKIP LOCKED over all its
        # buckets (coordinator/coordinator.py), so the join is off the path to the first claim.
        joining = asyncio.create_task(self._join(), name="join")
        # Connect every store now: a stall that starts later then shows as a statement without
        # an answer (statement_timeout_s), not first as a connect timeout (connect_timeout_s).
        for result in await asyncio.gather(
            *(s.connection() for s in self.services.stores), return_exceptions=True
        ):
            if isinstance(result, StoreError):
                log.warning("%s: will connect on first use", result)
            elif isinstance(result, BaseException):
                joining.cancel()
                await asyncio.gather(joining, return_exceptions=True)
                raise result
        # Under archive, a partition covers the clock before the first completion can need one.
        await self.services.pruner.cover_the_clock()
        if self.services.listener is not None:
            await self.services.listener.start()
        else:
            log.info(
                "LISTEN is off (listen_dsn=none): idle workers find new jobs by polling every %g s",
                self.config.claims.poll_interval_s,
            )
        background = [
            asyncio.create_task(self.completer.run(), name="completer"),
            asyncio.create_task(self.stuck_watch.run(), name=self.stuck_watch.name),
        ]
        background += [asyncio.create_task(s.run(), name=s.name) for s in self.services.periodic]
        producer = asyncio.create_task(self.producer.run(), name="producer")
        stopping = asyncio.create_task(self._stop.wait(), name="stop requested")
        try:
            await asyncio.wait((joining, stopping), return_when=asyncio.FIRST_COMPLETED)
            if joining.done():
                joining.result()  # a bug in a coordinator's start raises here, as it always did
                self.started.set()
                self.vitals.started = True
                claims = self.config.claims
                log.info(
                    "worker %s running: mode=%s queues=%s concurrency=%d buckets=%s",
                    self.config.worker.worker_id,
                    claims.mode,
                    ",".join(claims.queues),
                    claims.concurrency,
                    "all"
                    if not claims.partitioned
                    else " ".join(
                        f"{q}:{_fmt_buckets(a.owned())}" for q, a in self.assignments.items()
                    ),
                )
            await stopping
        finally:
            stopping.cancel()
            joining.cancel()  # a stop during the join: leaving (in the shutdown) cleans up after it
            await asyncio.gather(stopping, joining, return_exceptions=True)
            await asyncio.shield(self._shutdown(producer, background))

    async def _join(self) -> None:
        await asyncio.gather(
            *(
                a.start(on_revoke=self.producer.on_revoke)
                for a in self.services.distinct_assignments
            )
        )

    def stop(self, *, grace_s: float | None = None) -> None:
        """Begin a graceful shutdown (idempotent; call from a signal handler). The grace period
        runs from the first call."""
        if grace_s is not None:
            self._grace_override = grace_s
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self.vitals.stopping = True
        self._stop.set()

    def _give_up(self, reason: str) -> None:
        """The stuck watch's verdict (ignored once a shutdown has begun: it ends within its
        bound)."""
        if self._stop.is_set():
            return
        self.gave_up, self.vitals.gave_up = reason, True
        log.error(
            "giving up on stuck handlers: %s. This worker stops claiming, lets its other jobs "
            "finish within %g s and exits with code %d; the stuck handlers end with the process "
            "and their jobs come back when their leases run out",
            reason,
            self.config.worker.shutdown_grace_s,
            EXIT_STUCK,
        )
        if self.on_give_up is not None:
            self.on_give_up()
        self.stop()

    async def _shutdown(
        self, producer: asyncio.Task[None], background: list[asyncio.Task[None]]
    ) -> None:
        begun = self._stop_requested_at or time.monotonic()
        grace = (
            self._grace_override
            if self._grace_override is not None
            else self.config.worker.shutdown_grace_s
        )
        grace_ends = begun + grace
        overrun_ends = grace_ends + SHUTDOWN_OVERRUN_S
        # 1. Stop claiming (never mid-statement: a claim in flight finishes and its jobs start),
        #    and leave the group, so our buckets move now, not after the grace period. Leaving
        #    runs beside steps 2-3: a coordinator that does not answer must not eat the grace.
        self.producer.stop()
        self.executor.stop_starting()
        await _within(producer, grace_ends)  # a claim in flight is bounded by its statement timeout
        leaving = asyncio.create_task(_stop_all(self.services.distinct_assignments), name="leave")
        # 2. Claimed but never started: back to the queue at once, the attempt not counted.
        await self._release_unstarted(grace_ends)
        # 3. Running jobs get the rest of the grace (stuck ones are not waited for), then are
        # interrupted.
        await self.executor.drain(grace_ends, self.stuck_watch.count_now)
        self.abandoned = await self.executor.interrupt(INTERRUPT_WAIT_S)
        # 4. Every outcome we can write before the deadline reaches the database; then close.
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        # Beside the flush (another connection): the next pod samples the table, prunes, sweeps and
        # enqueues schedules at its next tick instead of after our leases run out.
        releasing = asyncio.create_task(_release_roles(*self.services.roles), name="release roles")
        await self._flush_until(overrun_ends - 0.5)
        # The charts' counts of those last outcomes: one short flush (queue_stats.py).
        await self.services.stats_flusher.final_flush(
            min(FINAL_FLUSH_S, max(0.0, overrun_ends - 0.3 - time.monotonic()))
        )
        await _within(leaving, overrun_ends - 0.2)
        await _within(releasing, overrun_ends - 0.2)
        if self.services.listener is not None:
            await self.services.listener.stop()
        self.executor.close()
        job_metrics.COLLECTOR.untrack(self.executor)
        for store in self.services.stores:
            await store.close()
        log.info(
            "worker %s stopped in %.1f s",
            self.config.worker_id,
            time.monotonic() - begun,
            extra={**asdict(self.stats), **asdict(self.completer.stats)},
        )

    async def _release_unstarted(self, deadline: float) -> None:
        """Give the unstarted jobs back: tried at least once, retried until `deadline`."""
        unstarted = self.executor.take_unstarted()
        if not unstarted:
            return
        attempt = 0
        while True:
            try:
                released = await self.services.maintenance_store.jobs_release_owned(unstarted)
            except StoreError as exc:
                attempt += 1
                if time.monotonic() >= deadline:
                    break
                log.warning("release of unstarted jobs failed (try %d): %s", attempt, exc)
                await asyncio.sleep(
                    min(0.2 * 2**attempt, 2.0, max(0.0, deadline - time.monotonic()))
                )
                continue
            self._released += released
            metrics.JOBS_RELEASED.inc(released)
            log.info("released %d claimed-but-unstarted jobs", released)
            return
        log.error(
            "could not release %d unstarted jobs in time; their leases will bring them back",
            len(unstarted),
        )

    async def _flush_until(self, deadline: float) -> None:
        attempt = 0
        while True:
            try:
                await asyncio.wait_for(
                    self.completer.flush(), timeout=max(0.0, deadline - time.monotonic())
                )
                return
            except (StoreError, TimeoutError) as exc:
                attempt += 1
                if time.monotonic() >= deadline:
                    break
                log.warning("final flush failed (try %d): %s", attempt, exc)
                await asyncio.sleep(
                    min(0.1 * 2**attempt, 1.0, max(0.0, deadline - time.monotonic()))
                )
        self.unflushed = self.completer.pending
        log.error(
            "could not write %d outcomes before the shutdown deadline; their leases will bring the "
            "jobs back (fenced if they were written after all)",
            self.unflushed,
        )


async def _release_roles(*roles: RoleHolder) -> None:
    for role in roles:
        await role.release()


async def _stop_all(assignments: list[BucketAssignment]) -> None:
    await asyncio.gather(*(a.stop() for a in assignments))


async def _within(task: Awaitable[None], deadline: float) -> None:
    """Wait for `task` until `deadline`, then cancel it and go on."""
    fut = asyncio.ensure_future(task)
    done, _ = await asyncio.wait((fut,), timeout=max(0.0, deadline - time.monotonic()))
    name = fut.get_name() if isinstance(fut, asyncio.Task) else "a task"
    if not done:
        log.warning("%s did not finish in time during shutdown: cancelled", name)
        fut.cancel()
        # not longer: it may be stuck in a cancellation of its own
        await asyncio.wait((fut,), timeout=0.5)
    elif not fut.cancelled() and fut.exception() is not None:
        log.warning("%s failed during shutdown: %r", name, fut.exception())


def _fmt_buckets(buckets: tuple[int, ...] | None) -> str:
    if buckets is None:
        return "none yet (joining or degraded: SKIP LOCKED)"
    return ",".join(map(str, buckets)) if len(buckets) < 12 else f"{len(buckets)} buckets"


def run_worker(
    config: Config,
    registry: Registry,
    *,
    install_signals: bool = True,
    on_started: Callable[[Worker], None] | None = None,
    health: Health | None = None,
) -> Worker:
    """Run a worker on uvloop (asyncio's own loop where uvloop is not installed) until
    SIGTERM/SIGINT (see lifecycle.py for the exit guarantees).

    `health` (what the HTTP server's probes read) gets the loop heartbeat from the loop's first
    moment and the start-up checks' findings; the worker writes its vitals (health.vitals).

    Before it starts, the database must answer with a current schema (startup.py): a login the
    server refuses, or a missing or older schema, raises StartupError; an unreachable server is
    waited for. If shutdown leaves handlers running (they ignored cancellation, or their threads
    never returned), the process exits here, without waiting for them: their leases protect them.
    """
    from dispatcher.serve.lifecycle import ShutdownSignals, hard_exit
    from dispatcher.serve.startup import check_listen, wait_until_ready

    worker = Worker(config, registry, vitals=None if health is None else health.vitals)
    database, settings = config.database, config.worker

    async def main() -> None:
        beat = (
            None
            if health is None
            else asyncio.create_task(health.beat_forever(), name="loop heartbeat")
        )
        try:
            await start_and_run()
        finally:
            if beat is not None:
                beat.cancel()

    async def start_and_run() -> None:
        if install_signals:
            signals = ShutdownSignals(
                asyncio.get_running_loop(),
                worker.stop,
                bound_s=exit_bound_s(settings),
                announce=log.info,
            )
            signals.install()
            worker.on_give_up = lambda: signals.arm(EXIT_STUCK)  # the same bound as after a SIGTERM
        ready = await wait_until_ready(
            database.dsn,  # type: ignore[arg-type]  # set: the Worker refuses a Config without it
            database.limits,
            wait_for_schema=settings.wait_for_schema,
            stopping=worker.stopping,
            on_state=None if health is None else health.startup.update,
        )
        if not ready:
            log.info("stopped before the database was ready")
            return
        if settings.listen_dsn not in (None, database.dsn):
            await check_listen(settings.listen_dsn, database.limits)
        if on_started is not None:
            on_started(worker)
        await worker.run()
        if worker.abandoned and install_signals:
            hard_exit(
                f"{worker.abandoned} handlers still run after the shutdown bound", worker.exit_code
            )

    run_loop(main())
    return worker


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """`main` on uvloop where it is installed, else on asyncio's own loop. uvloop is a dependency
    only where it installs (pyproject's marker leaves out Windows and PyPy), so its absence must
    not stop a worker: the runtime uses asyncio's API alone, and the loop's share of a job's CPU
    (bench/RESULTS.md, the py-spy profile) is what uvloop saves."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
