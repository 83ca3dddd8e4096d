"""Per-job metrics: run time, outcomes and timeouts by queue and job type, how long claimed jobs
waited after they were due (by queue), and running jobs by queue.

Counted in plain Python on the hot path and turned into Prometheus families at scrape time, which
is ~15x cheaper per job than prometheus_client's labelled metrics
(docs/design/health-and-metrics.md; `python -m dispatcher.observe.job_metrics` measures it).
Writers are on the event loop only.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# Handler run times, 1 ms to an hour (the default job timeout is 10 min).
DURATION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
# Every outcome is exported (0 until it happens) for each job type seen, so a rate() over it
# exists before the first failure. `snoozed`: a `raise Snooze(s)` that did not spend an attempt.
# Counted once the attempt's write was accepted: a fenced one is not an outcome (completer.py).
OUTCOMES = ("completed", "retried", "failed", "discarded", "cancelled", "snoozed")
# Job types are the application's handlers, but a job of an unknown type (a typo in an enqueue)
# fails with its own label too: past this many (queue, type) pairs, new ones are counted under
# OTHER_TYPE so a stream of bogus types cannot grow the scrape without bound.
MAX_JOB_TYPES = 500
OTHER_TYPE = "_other"
# Queue waits, due (run_at) to claimed: 5 ms to a day (a backlog, or a paused queue, can hold jobs
# for hours).
WAIT_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    21600.0,
    86400.0,
)


class _PerType:
    __slots__ = ("buckets", "outcomes", "sum_s", "timeouts")

    def __init__(self, n_buckets: int) -> None:
        # not cumulative: bucket i counts bounds[i-1] < d <= bounds[i]
        self.buckets = [0] * n_buckets
        self.sum_s = 0.0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.timeouts = 0


class _Waits:
    __slots__ = ("buckets", "sum_s")

    def __init__(self, n_buckets: int) -> None:
        self.buckets = [0] * n_buckets
        self.sum_s = 0.0


Key = tuple[str, str]  # (queue, job type)


class JobStats:
    """Counts of finished attempts and of queue waits in this process; read by JobCollector at
    scrape time."""

    def __init__(
        self,
        bounds_s: tuple[float, ...] = DURATION_BUCKETS_S,
        max_types: int = MAX_JOB_TYPES,
        wait_bounds_s: tuple[float, ...] = WAIT_BUCKETS_S,
    ) -> None:
        self.bounds_s = bounds_s
        self.wait_bounds_s = wait_bounds_s
        self._max_types = max_types
        self._types: dict[Key, _PerType] = {}
        self._waits: dict[str, _Waits] = {}

    def _of(self, queue: str, job_type: str) -> _PerType:
        stats = self._types.get((queue, job_type))
        if stats is None:
            key = (queue, job_type if len(self._types) < self._max_types - 1 else OTHER_TYPE)
            stats = self._types.get(key)
            # one assignment of a new object: a scrape sees it whole or not at all
            if stats is None:
                stats = self._types[key] = _PerType(len(self.bounds_s) + 1)
        return stats

    # Hot path: once per finished attempt.
    def finished(self, queue: str, job_type: str, outcome: str, duration_s: float) -> None:
        stats = self._types.get((queue, job_type)) or self._of(queue, job_type)
        stats.buckets[bisect.bisect_left(self.bounds_s, duration_s)] += 1
        stats.sum_s += duration_s
        stats.outcomes[outcome] += 1

    def timed_out(self, queue: str, job_type: str) -> None:
        self._of(queue, job_type).timeouts += 1

    # Hot path: once per claim statement, with the wait of each job it claimed (seconds, the
    # database's clock). Queues are the worker's own few: no bound needed.
    def waited(self, queue: str, waits_s: Iterable[float]) -> None:
        stats = self._waits.get(queue)
        if stats is None:
            stats = self._waits[queue] = _Waits(len(self.wait_bounds_s) + 1)
        bounds, buckets, total = self.wait_bounds_s, stats.buckets, 0.0
        for wait_s in waits_s:
            buckets[bisect.bisect_left(bounds, wait_s)] += 1
            total += wait_s
        stats.sum_s += total

    def snapshot(self) -> list[tuple[Key, list[int], float, dict[str, int], int]]:
        """((queue, job type), bucket counts, sum, outcomes, timeouts) per pair, copied for a
        scrape."""
        return [
            (key, list(s.buckets), s.sum_s, s.outcomes.copy(), s.timeouts)
            for key, s in list(self._types.items())
        ]

    def wait_snapshot(self) -> list[tuple[str, list[int], float]]:
        """(queue, bucket counts, sum) per queue, copied for a scrape."""
        return [(queue, list(s.buckets), s.sum_s) for queue, s in list(self._waits.items())]


class RunningSource(Protocol):
    def running_by_queue(self) -> dict[str, int]: ...


class JobCollector:
    """The families of JobStats, plus jobs running now from the tracked executors."""

    def __init__(self, stats: JobStats) -> None:
        self._stats = stats
        self._sources: weakref.WeakKeyDictionary[RunningSource, tuple[str, ...]] = (
            weakref.WeakKeyDictionary()
        )

    def track(self, source: RunningSource, queues: Iterable[str]) -> None:
        """Count `source`'s running jobs (each of `queues` exported, 0 when idle) while it lives."""
        self._sources[source] = tuple(queues)

    def untrack(self, source: RunningSource) -> None:
        self._sources.pop(source, None)

    def describe(self) -> Iterator[Metric]:
        return iter(self._families([], {}))

    def collect(self) -> Iterator[Metric]:
        running: dict[str, int] = {}
        for source, queues in list(self._sources.items()):
            for queue in queues:
                running.setdefault(queue, 0)
            for queue, n in source.running_by_queue().items():
                running[queue] = running.get(queue, 0) + n
        return iter(self._families(self._stats.snapshot(), running, self._stats.wait_snapshot()))

    def _families(
        self,
        snapshot: list[tuple[Key, list[int], float, dict[str, int], int]],
        running: dict[str, int],
        waits: list[tuple[str, list[int], float]] | None = None,
    ) -> list[Metric]:
        duration = HistogramMetricFamily(
            "dispatcher_job_duration_seconds",
            "Handler run time of every finished attempt",
            labels=["queue", "job_type"],
        )
        outcomes = CounterMetricFamily(
            "dispatcher_job_outcomes",
            "Finished attempts by the status they end in, as written (retried: queued again; "
            "snoozed: queued again by a Snooze, no attempt spent; fenced ones are not counted)",
            labels=["queue", "job_type", "outcome"],
        )
        timeouts = CounterMetricFamily(
            "dispatcher_job_timeouts",
            "Attempts that overran their time limit",
            labels=["queue", "job_type"],
        )
        for (queue, job_type), counts, sum_s, by_outcome, timed_out in snapshot:
            duration.add_metric([queue, job_type], _cumulative(self._stats.bounds_s, counts), sum_s)
            for outcome, n in by_outcome.items():
                outcomes.add_metric([queue, job_type, outcome], n)
            timeouts.add_metric([queue, job_type], timed_out)
        queue_wait = HistogramMetricFamily(
            "dispatcher_job_queue_wait_seconds",
            "Claimed jobs' time from due (run_at) to their claim, by the database's clock",
            labels=["queue"],
        )
        for queue, counts, sum_s in sorted(waits or []):
            queue_wait.add_metric([queue], _cumulative(self._stats.wait_bounds_s, counts), sum_s)
        jobs_running = GaugeMetricFamily(
            "dispatcher_jobs_running",
            "Jobs whose handler runs in this worker now",
            labels=["queue"],
        )
        for queue, n in sorted(running.items()):
            jobs_running.add_metric([queue], n)
        return [duration, outcomes, timeouts, queue_wait, jobs_running]


def _cumulative(bounds_s: tuple[float, ...], counts: list[int]) -> list[tuple[str, int]]:
    cumulative, total = [], 0
    for bound, n in zip([*map(str, bounds_s), "+Inf"], counts, strict=True):
        total += n
        cumulative.append((bound, total))
    return cumulative


JOB_STATS = JobStats()
COLLECTOR = JobCollector(JOB_STATS)
REGISTRY.register(COLLECTOR)


def _benchmark() -> None:  # pragma: no cover - the figure in the module docstring
    import timeit

    stats = JobStats()
    n = 1_000_000
    for name, stmt in (
        ("JobStats.finished", lambda: stats.finished("default", "send_email", "completed", 0.0123)),
    ):
        best = min(timeit.repeat(stmt, number=n, repeat=5)) / n
        print(f"{name}: {best * 1e6:.3f} us per call")
    from prometheus_client import CollectorRegistry, Counter, Histogram

    registry = CollectorRegistry()
    hist = Histogram(
        "h_seconds", "h", ["queue", "job_type"], buckets=DURATION_BUCKETS_S, registry=registry
    )
    counter = Counter("c", "c", ["queue", "job_type", "outcome"], registry=registry)

    def client() -> None:
        hist.labels("default", "send_email").observe(0.0123)
        counter.labels("default", "send_email", "completed").inc()

    best = min(timeit.repeat(client, number=n, repeat=5)) / n
    print(f"prometheus_client observe + inc: {best * 1e6:.3f} us per call")


if __name__ == "__main__":  # pragma: no cover
    _benchmark()
