"""Prometheus metrics of the coordinator (the queue's own live in dispatcher/observe/metrics.py)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric

MEMBERS = Gauge("dispatcher_coordinator_members", "Live members seen by this worker")
IS_LEADER = Gauge("dispatcher_coordinator_is_leader", "1 while this worker computes assignments")
# One coordination group per queue: `queue` is the group's name.
OWNED_BUCKETS = Gauge(
    "dispatcher_coordinator_owned_buckets", "Buckets this worker polls now", ["queue"]
)
REBALANCES = Counter(
    "dispatcher_coordinator_rebalances_total", "Rebalances written by the leader", ["reason"]
)
BUCKETS_MOVED = Counter(
    "dispatcher_coordinator_buckets_moved_total", "Bucket ownership changes applied", ["kind"]
)
HANDOVERS = Counter(
    "dispatcher_coordinator_handovers_total", "Buckets this worker handed over on request"
)
REBALANCE_SECONDS = Histogram(
    "dispatcher_coordinator_rebalance_seconds",
    "Plan + write of one rebalance by the leader",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
DEGRADED = Gauge(
    "dispatcher_coordinator_degraded",
    "1 while the backend is unreachable past the lease (SKIP LOCKED)",
)
DEGRADED_ENTERED = Counter(
    "dispatcher_coordinator_degraded_entered_total", "Times this worker fell back to SKIP LOCKED"
)


class _Beating(Protocol):
    def heartbeat_age_s(self) -> float: ...


class _HeartbeatAge:
    """dispatcher_coordinator_heartbeat_age_seconds, computed when scraped (the scrape runs in a
    thread of its own), so it keeps growing while heartbeats fail or the event loop is stalled.
    The oldest of the running coordinators (one per queue); no sample when none runs."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[_Beating] = weakref.WeakSet()

    def track(self, coordinator: _Beating) -> None:
        self._live.add(coordinator)

    def untrack(self, coordinator: _Beating) -> None:
        self._live.discard(coordinator)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "dispatcher_coordinator_heartbeat_age_seconds",
            "Seconds since the last successful membership heartbeat (the oldest of this "
            "worker's groups)",
        )
        ages = [c.heartbeat_age_s() for c in list(self._live)]
        if ages:
            family.add_metric([], max(ages))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("dispatcher_coordinator_heartbeat_age_seconds", "")


HEARTBEAT_AGE = _HeartbeatAge()
REGISTRY.register(HEARTBEAT_AGE)
