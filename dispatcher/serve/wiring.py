"""The worker's services, built and connected to one another: what `Worker` (worker.py) runs.

`build_services` makes the stores (one connection per loop), the bucket assignments, flow control,
the completer, the executor, the producer, the LISTEN connection and the maintenance services,
each from its own settings section and each given its collaborators when it is built. Nothing here
runs anything: starting, and stopping in order, is the worker's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from coordinator.assignment import BucketAssignment
from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.registry import Registry
from dispatcher.api.schedules.scheduler import Scheduler
from dispatcher.db.listener import Listener
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.store import JobStore
from dispatcher.runtime.chaining import Chaining
from dispatcher.runtime.completer import Completer
from dispatcher.runtime.dep_sweeper import DepSweeper
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.flow_control import FlowControl
from dispatcher.runtime.janitor import Pruner
from dispatcher.runtime.maintenance import LeaseKeeper, PlannerStats, Reaper
from dispatcher.runtime.ordering import KeySweeper
from dispatcher.runtime.presence import Identity, Presence, declared_schedules
from dispatcher.runtime.producer import Producer
from dispatcher.runtime.progress import ProgressFlusher
from dispatcher.runtime.queue_stats import StatsFlusher, StatsRollup
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.runtime.stuck import StuckWatch
from dispatcher.runtime.table_sampler import TableSampler
from dispatcher.runtime.vitals import Vitals
from dispatcher.serve.coordination import build_assignments
from dispatcher.settings.config import Config

# (dsn, worker_id, application_name, limits, completed_jobs)
StoreFactory = Callable[[str, str, str, ConnectionLimits, str], JobStore]

# A service that holds a fleet-wide role (one pod at a time): released at shutdown, so the next
# pod takes it at its next tick instead of after our lease runs out.
RoleHolder = TableSampler | Pruner | KeySweeper | DepSweeper | StatsRollup | Scheduler | Presence


def connect_store(
    dsn: str, worker_id: str, application_name: str, limits: ConnectionLimits, completed_jobs: str
) -> JobStore:
    return JobStore(
        dsn,
        worker_id,
        application_name=application_name,
        limits=limits,
        completed_jobs=completed_jobs,
    )


@dataclass(frozen=True, slots=True)
class Services:
    """One worker's services, connected: the job's path and, beside it, maintenance."""

    # One per queue (coordination.py); `distinct`: each object once (static and SKIP LOCKED
    # configurations share one across queues).
    assignments: dict[str, BucketAssignment]
    distinct_assignments: list[BucketAssignment]
    # claims; completions and heartbeats; the other maintenance services (and releases)
    stores: tuple[JobStore, JobStore, JobStore]
    flow: FlowControl
    completer: Completer
    executor: Executor
    producer: Producer
    listener: Listener | None  # None: listen_dsn=none, wake-ups by polling only
    lease_keeper: LeaseKeeper
    progress: ProgressFlusher  # handlers' progress reports: the sink their jobs report to
    stuck_watch: StuckWatch
    reaper: Reaper
    pruner: Pruner
    key_sweeper: KeySweeper
    dep_sweeper: DepSweeper
    table_sampler: TableSampler
    scheduler: Scheduler
    presence: Presence  # this worker's row in the worker registry
    # the dashboard charts' counts (every worker) and their per-minute rollup (one pod)
    stats_flusher: StatsFlusher
    stats_rollup: StatsRollup
    periodic: tuple[PeriodicService, ...]  # every loop of the maintenance, run beside the job path
    roles: tuple[RoleHolder, ...]

    @property
    def maintenance_store(self) -> JobStore:
        return self.stores[2]


def build_services(
    config: Config,
    registry: Registry,
    vitals: Vitals,
    *,
    on_give_up: Callable[[str], None],
    assignments: Mapping[str, BucketAssignment] | None = None,
    store_factory: StoreFactory = connect_store,
) -> Services:
    """Every service of a worker for `config` (whose dsn is set), built with its collaborators.

    `on_give_up`: the stuck watch's verdict (why), for the worker to stop on; `assignments`: given
    by tests, else built for config.coordination, giving up membership while `vitals` say the
    worker cannot work."""
    database, worker, claims = config.database, config.worker, config.claims
    by_queue = dict(assignments or build_assignments(config.coordination, liveness=vitals))
    distinct = list({id(a): a for a in by_queue.values()}.values())

    def store(role: str) -> JobStore:
        dsn: str = database.dsn  # type: ignore[assignment]  # the worker checked it
        return store_factory(
            dsn,
            worker.worker_id,
            f"dispatcher-{role}",
            database.limits,
            config.completion.completed_jobs,
        )

    # One connection per loop: claims; completions and heartbeats (short owner-fenced writes,
    # so a slow ANALYZE never delays a heartbeat); the other maintenance services together.
    claim_store, completions, maint = store("claim"), store("complete"), store("maint")
    policy = RetryPolicy(config.execution.retry_base_s, config.execution.retry_cap_s)
    executor: Executor
    presence = Presence(
        maint,
        Identity(
            worker.worker_id,
            claims.mode,
            config.coordination.coordinator if claims.partitioned else "none",
            tuple(claims.queues),
            tuple(registry.job_types()),
            claims.concurrency,
            declared_schedules(registry.schedules(), claims.queues),
        ),
        lambda: executor.in_flight,
        unserved_window_s=config.execution.unserved_type_discard_s,
    )
    flow = FlowControl(claim_store, claims.queues, vitals=vitals)
    # The executor is built on the completer, yet the completer's chained claims start on the
    # executor and its writes wake the producer: it reaches those two, built after it, through
    # callables (called only once the worker runs).
    producer: Producer
    chaining = (
        Chaining(
            lambda: executor,
            by_queue,
            claims.concurrency,
            claims.lease_s,
            claims.mode,
            lambda: producer.claiming,
        )
        if claims.partitioned
        else None
    )
    completer = Completer(
        completions,
        config.completion,
        chaining=chaining,
        urgent_types=flow.urgent_types,
        written=lambda: producer.outcomes_written(),
        unserved_window_s=config.execution.unserved_type_discard_s,
    )
    # Handlers' progress, written on the completions' connection, and a finishing job's last
    # report before its outcome.
    progress = ProgressFlusher(completions, config.execution.progress_flush_s)
    completer.before_write = progress.finishing
    executor = Executor(
        registry,
        policy,
        completer,
        config.execution,
        config.leases,
        served_lately=presence.served_lately,
        progress=progress,
    )
    producer = Producer(claims, claim_store, by_queue, executor, vitals=vitals, flow=flow)
    # listen_dsn (a direct connection when dsn goes through PgBouncer), or none: polling only.
    listener = (
        None
        if worker.listen_dsn is None
        else Listener(
            worker.listen_dsn,
            set(claims.queues),
            producer.on_notify,
            limits=database.limits,
            probe_s=worker.listen_probe_s,
        )
    )
    lease_keeper = LeaseKeeper(completions, executor, config.leases, vitals=vitals)
    stuck_watch = StuckWatch(
        executor.held, config.execution, claims.concurrency, on_give_up=on_give_up
    )
    reaper = Reaper(
        maint,
        policy,
        config.maintenance,
        on_reaped=producer.wake,
        vitals=vitals,
        halts=registry.halts,
        retry_of=registry.retry_of,
    )
    pruner = Pruner(maint, config.retention)
    key_sweeper = KeySweeper(maint, claims.queues)
    dep_sweeper = DepSweeper(maint)
    stats_flusher = StatsFlusher(maint, limits=database.limits)
    stats_rollup = StatsRollup(maint)
    table_sampler = TableSampler(
        maint, interval_s=config.maintenance.table_sample_interval_s, queues=claims.queues
    )
    scheduler = Scheduler(
        maint,
        registry.schedules(),
        claims.queues,
        completed_jobs=config.completion.completed_jobs,
        defers=presence.defers_schedules,
        yielding=presence.yielding_schedules,
    )
    return Services(
        assignments=by_queue,
        distinct_assignments=distinct,
        stores=(claim_store, completions, maint),
        flow=flow,
        completer=completer,
        executor=executor,
        producer=producer,
        listener=listener,
        lease_keeper=lease_keeper,
        progress=progress,
        stuck_watch=stuck_watch,
        reaper=reaper,
        pruner=pruner,
        key_sweeper=key_sweeper,
        dep_sweeper=dep_sweeper,
        table_sampler=table_sampler,
        scheduler=scheduler,
        presence=presence,
        stats_flusher=stats_flusher,
        stats_rollup=stats_rollup,
        periodic=(
            presence,
            lease_keeper,
            progress,
            reaper,
            pruner,
            key_sweeper,
            dep_sweeper,
            scheduler,
            PlannerStats(maint, interval_s=config.maintenance.reaper_interval_s),
            table_sampler,
            stats_flusher,
            stats_rollup,
        ),
        roles=(table_sampler, pruner, key_sweeper, dep_sweeper, stats_rollup, scheduler, presence),
    )
