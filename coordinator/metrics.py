"""Prometheus metrics of the coordinator (the queue's own live in dispatcher/metrics.py)."""

from prometheus_client import Counter, Gauge, Histogram

MEMBERS = Gauge("dispatcher_coordinator_members", "Live members seen by this worker")
IS_LEADER = Gauge("dispatcher_coordinator_is_leader", "1 while this worker computes assignments")
OWNED_BUCKETS = Gauge("dispatcher_coordinator_owned_buckets", "Buckets this worker polls now")
REBALANCES = Counter("dispatcher_coordinator_rebalances_total", "Rebalances written by the leader", ["reason"])
BUCKETS_MOVED = Counter("dispatcher_coordinator_buckets_moved_total", "Bucket ownership changes applied", ["kind"])
HANDOVERS = Counter("dispatcher_coordinator_handovers_total", "Buckets this worker handed over on request")
REBALANCE_SECONDS = Histogram(
    "dispatcher_coordinator_rebalance_seconds", "Plan + write of one rebalance by the leader",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
HEARTBEAT_AGE = Gauge("dispatcher_coordinator_heartbeat_age_seconds", "Seconds since the last successful heartbeat")
DEGRADED = Gauge("dispatcher_coordinator_degraded", "1 while the backend is unreachable past the lease (SKIP LOCKED)")
DEGRADED_ENTERED = Counter("dispatcher_coordinator_degraded_entered_total", "Times this worker fell back to SKIP LOCKED")
