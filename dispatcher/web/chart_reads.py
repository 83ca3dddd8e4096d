"""The charts' series, read from the per-minute rollup and the workers' rows not rolled up yet
(sql/stats.sql; runtime/queue_stats.py writes them), never from the jobs table: one bounded
transaction per page. A span is 60 points of a minute (1h) or 144 of 10 minutes (24h); points
without a row are gaps: 0 finished and failed, no depth, no wait percentiles. The last point is
still filling: its rates are over the part of it gone by, so the line does not dip at the edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.db import rows
from dispatcher.db.oneshot import bounded_transaction
from dispatcher.db.queries import query
from dispatcher.observe.job_metrics import WAIT_BUCKETS_S
from dispatcher.web.reads import READ_BUDGET

# span -> (seconds per point, points)
SPANS = {"1h": (60, 60), "24h": (600, 144)}
DEFAULT_SPAN = "1h"


# The last point's rate is taken over at least this much of it: a few seconds in, one flush
# would read as a spike.
MIN_ELAPSED_S = 15.0


@dataclass(frozen=True, slots=True)
class Anchor:
    """One row of stats_anchor."""

    anchor: datetime
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class StatsPoint:
    """One row of stats_series."""

    at: datetime
    finished: int
    failed: int
    depth: int | None
    waits: list[int] | None


@dataclass(frozen=True, slots=True)
class Series:
    """A span's points, oldest first, every point present."""

    span: str
    step_s: int
    starts: list[datetime]  # each point's start (UTC)
    finished_per_min: list[float]
    failed_per_min: list[float]
    depth: list[int | None]
    wait_p50_s: list[float | None]
    wait_p99_s: list[float | None]
    any_data: bool  # some row in the span: else the charts say there is none yet


def percentile(
    counts: Sequence[int], q: float, bounds: Sequence[float] = WAIT_BUCKETS_S
) -> float | None:
    """The `q` quantile (0..1) of a histogram (counts per bucket: bucket i holds bounds[i-1] < x <=
    bounds[i], the last one above every bound), interpolated linearly within its bucket as
    Prometheus' histogram_quantile does; the first bucket starts at 0, and a quantile in the last
    one is its lower bound (the largest bound: "at least"). None for an empty histogram."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            low = 0.0 if i == 0 else float(bounds[i - 1])
            return low + (float(bounds[i]) - low) * max(0.0, rank - seen) / n
        seen += n
    return float(bounds[-1])


def series_of(
    points: Sequence[StatsPoint], anchor: datetime, span: str, elapsed_s: float | None = None
) -> Series:
    """Every point of `span` up to the one starting at `anchor`, from the rows there are;
    `elapsed_s`: how much of that last point has gone by (None: all of it)."""
    step_s, n = SPANS[span]
    starts = [anchor - timedelta(seconds=step_s * (n - 1 - i)) for i in range(n)]
    by_start = {p.at: p for p in points}
    finished, failed, depth, p50, p99 = [], [], [], [], []
    for start in starts:
        p = by_start.get(start)
        span_s = float(step_s)
        if start == anchor and elapsed_s is not None:
            span_s = max(MIN_ELAPSED_S, min(span_s, elapsed_s))
        per_min = span_s / 60
        finished.append(p.finished / per_min if p else 0.0)
        failed.append(p.failed / per_min if p else 0.0)
        depth.append(p.depth if p else None)
        waits = p.waits if p and p.waits else []
        p50.append(percentile(waits, 0.5))
        p99.append(percentile(waits, 0.99))
    return Series(span, step_s, starts, finished, failed, depth, p50, p99, bool(points))


def read_series(
    conn: psycopg.Connection[Any], limits: ConnectionLimits, span: str, queue: str | None = None
) -> Series:
    """The charts of one queue, or of every queue summed (`queue` None)."""
    step_s, n = SPANS[span]
    with bounded_transaction(conn, "dashboard charts", limits, budget=READ_BUDGET):
        (now,) = rows.typed(
            Anchor, conn.execute(query("stats_anchor"), {"step_s": step_s}, prepare=False)
        )
        anchor = now.anchor
        since = anchor - timedelta(seconds=step_s * (n - 1))
        params = {"since": since, "step_s": step_s, "queue": queue}
        found = rows.typed(StatsPoint, conn.execute(query("stats_series"), params, prepare=False))
    return series_of([p for p in found if p.at >= since], anchor, span, now.elapsed_s)
