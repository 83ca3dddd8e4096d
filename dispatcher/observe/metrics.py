"""Prometheus metrics for the worker runtime (served by http_server.py).

Counters move once per batch, never once per job (docs/design/health-and-metrics.md); per-job
figures are in job_metrics.py, table-wide ones in table_sampler.py, readiness in health.py.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

from dispatcher._version import __version__

# No `<name>_created` series: a process start time per labelled counter and histogram, which doubled
# the families a scrape lists and that no rule or panel of ours reads (process_start_time_seconds
# says when a worker started). Process-wide: it also applies to an app's own metrics in a worker.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated

# Fine enough to read p50/p99 of a claim (0.5-20 ms here) from the buckets, as the bench suite does.
_LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

JOBS_CLAIMED = Counter("dispatcher_jobs_claimed_total", "Jobs claimed", ["queue", "mode"])
JOBS_COMPLETED = Counter(
    "dispatcher_jobs_completed_total",
    "Jobs completed (written: marked completed, or deleted if DISPATCHER_COMPLETED_JOBS=delete)",
)
JOBS_RETRIED = Counter("dispatcher_jobs_retried_total", "Failed attempts rescheduled for retry")
JOBS_FAILED = Counter("dispatcher_jobs_failed_total", "Jobs failed for good (attempts exhausted)")
JOBS_UNSERVED = Counter(
    "dispatcher_jobs_unserved_total",
    "Jobs claimed by a worker without a handler for their type (a rollout): handed_back (their "
    "attempt not spent), discarded (nobody served the type for DISPATCHER_UNSERVED_TYPE_DISCARD_S) "
    "or cancelled (an operator asked meanwhile)",
    ["queue", "job_type", "outcome"],
)
JOBS_DISCARDED = Counter("dispatcher_jobs_discarded_total", "Jobs discarded by a permanent error")
JOBS_FENCED = Counter(
    "dispatcher_fenced_writes_total",
    "Completions or failures dropped because the job's owner token changed",
)
JOBS_RELEASED = Counter(
    "dispatcher_jobs_released_total", "Claimed-but-unstarted jobs given back on shutdown"
)
JOBS_REAPED = Counter(
    "dispatcher_jobs_reaped_total", "Running jobs whose lease expired, requeued or failed"
)
ORDERING_KEYS_PROMOTED = Counter(
    "dispatcher_ordering_keys_promoted_total",
    "Ordering keys found with waiting jobs and no holder by the sweeper, "
    "whose next job it promoted",
)
DEPENDENCIES_SWEPT = Counter(
    "dispatcher_dependencies_swept_total",
    "Parents found ended with their children not yet released (a worker died between the two), "
    "whose children the dependency sweeper released",
)
LEASES_LOST = Counter(
    "dispatcher_leases_lost_total",
    "Leases of running or claimed jobs this worker lost, by reason: taken_over (a heartbeat found "
    "the job no longer ours) or ran_out (it ran out by the worker's own timer while heartbeats "
    "did not reach the database: a stall, a stopped process)",
    ["reason"],
)
for _reason in ("taken_over", "ran_out"):  # both series from the start, at 0
    LEASES_LOST.labels(_reason)
LOST_LEASE_JOBS = Counter(
    "dispatcher_lost_lease_jobs_total",
    "Jobs whose lease this worker lost (taken over, or run out while the database was "
    "unreachable), by what became of them here: dropped before they started, cancelled (async), or "
    "left to finish in a thread (sync; its outcome is fenced)",
    ["action"],
)
STATEMENT_TIMEOUTS = Counter(
    "dispatcher_statement_timeouts_total",
    "Statements that got no answer within their deadline; each costs its connection",
    ["operation"],
)
DB_STALLED = Gauge(
    "dispatcher_db_stalled", "1 while this worker cannot keep its leases (it claims nothing)"
)
STUCK_JOBS = Gauge(
    "dispatcher_stuck_jobs",
    "Jobs whose handler still runs stuck_grace_s after its timeout fired (their slots stay taken)",
)
STUCK_JOBS_FOUND = Counter(
    "dispatcher_stuck_jobs_found_total", "Jobs found stuck (each counted once)"
)
JOBS_PRUNED = Counter(
    "dispatcher_jobs_pruned_total",
    "Rows deleted by this pod's pruner past their retention, by kind: completed jobs, failed ones "
    "(failed, discarded, cancelled) and history rows",
    ["kind"],
)
JANITOR_LAG = Gauge(
    "dispatcher_janitor_lag_seconds",
    "How far past its retention the oldest row of each kind still there is (0: caught up); "
    "kind archive: the oldest partition or default-partition row of the archive of completed "
    "jobs. From the pods whose last prune round ran, none from a pod that found another pruning",
    ["kind"],
)
ARCHIVE_PARTITIONS = Counter(
    "dispatcher_archive_partitions_total",
    "Partitions of the archive of completed jobs this pod's janitor created ahead of the clock, "
    "and dropped past retention (DISPATCHER_COMPLETED_JOBS=archive)",
    ["change"],
)
SCHEDULE_LAST_SUCCESS = Gauge(
    "dispatcher_schedule_last_success_timestamp_seconds",
    "When the schedule's latest job completed (Unix time), or, before its first success, when it "
    "was declared; "
    "from the pod enqueuing the schedule's queue (its schedules lease), none from the others",
    ["schedule"],
)
SCHEDULE_PERIOD = Gauge(
    "dispatcher_schedule_period_seconds",
    "Seconds between the schedule's next two slots (as last_success)",
    ["schedule"],
)
SCHEDULE_JOBS = Counter(
    "dispatcher_schedule_jobs_total", "Jobs this pod enqueued for schedules' slots", ["schedule"]
)
STOLEN_JOBS = Counter(
    "dispatcher_jobs_stolen_total", "Jobs claimed from other workers' buckets (own buckets idle)"
)
FLOW_HELD_BACK = Counter(
    "dispatcher_flow_limited_claims_total",
    "Claims of flow-controlled jobs that a fleet-wide limit cut short (dispatcher limits), by "
    "queue and by the kind of limit that bound: max_running or per_second",
    ["queue", "limit"],
)
QUEUE_PAUSED = Gauge(
    "dispatcher_queue_paused",
    "1 while the queue is paused (dispatcher queues pause), as this worker last read it",
    ["queue"],
)
PROGRESS_WRITES = Counter(
    "dispatcher_progress_writes_total",
    "Batched writes of running jobs' progress and metadata (Job.set_progress, update_meta): at "
    "most one per DISPATCHER_PROGRESS_FLUSH_S, and one before a flush of outcomes of jobs that "
    "reported",
)
STORE_ERRORS = Counter("dispatcher_store_errors_total", "Failed database statements", ["operation"])

JOBS_IN_FLIGHT = Gauge("dispatcher_jobs_in_flight", "Jobs claimed by this worker and not finished")
CLAIM_SECONDS = Histogram(
    "dispatcher_claim_seconds", "Latency of one claim statement", ["mode"], buckets=_LATENCY_BUCKETS
)
POLL_CYCLE_SECONDS = Histogram(
    "dispatcher_poll_cycle_seconds",
    "One claim-loop cycle: claims over all queues plus dispatch (the first signal of a degrading "
    "queue)",
    ["mode"],
    buckets=_LATENCY_BUCKETS,
)
CLAIM_BATCH = Histogram(
    "dispatcher_claim_batch_jobs",
    "Jobs returned per claim",
    buckets=(0, 1, 5, 10, 50, 100, 250, 500, 1000, 5000),
)
FLUSH_SECONDS = Histogram(
    "dispatcher_flush_seconds", "Latency of one completion flush", buckets=_LATENCY_BUCKETS
)


BUILD_INFO = Gauge(
    "dispatcher_build_info", "Always 1; the version of bucket-dispatcher in its label", ["version"]
)
BUILD_INFO.labels(__version__).set(1)
