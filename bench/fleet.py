"""A fleet of real worker processes for one benchmark run, and what they report.

Each worker is a `dispatcher run` process (the demo app's no-op handler) with a Prometheus port;
at the end of a run the fleet scrapes every worker's claim-latency and poll-cycle histograms
and merges them (quantiles are read from the histogram buckets, interpolated linearly).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from dispatcher.devtools import harness
from dispatcher.devtools.harness import http_text

from .core import cpu_seconds_of

APP = "dispatcher.devtools.demo_app:registry"
_BUCKET = re.compile(r'^(dispatcher_\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"(?:,[^}]*)?\}\s+([0-9.e+]+)$')


class Fleet(harness.Fleet):
    """The shared fleet (readiness, liveness, stop) with the benchmark's settings, its histograms
    and its CPU seconds."""

    def __init__(self, dsn: str, mode: str, workers: int, **settings: Any) -> None:
        base = dict(concurrency=500, batch_size=500, log_level="WARNING", coordinator="postgres",
                    coordinator_lease_s=10, poll_interval_s=0.1)
        base.update(settings)
        self._cpu_at_stop: float | None = None  # first: a failed start stops the workers already started
        super().__init__(dsn, APP, mode, workers, worker_id_prefix=f"bench-{mode}", **base)

    def __enter__(self) -> Fleet:
        return self

    def histograms(self) -> dict[str, list[tuple[float, float]]]:
        """name -> [(upper bound, cumulative count)] summed over the fleet."""
        merged: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for port in self.ports:
            for line in (http_text(port, "/metrics") or "").splitlines():
                m = _BUCKET.match(line)
                if m:
                    merged[m[1]][float(m[2])] += float(m[3])
        return {name: sorted(b.items()) for name, b in merged.items()}

    def cpu_seconds(self) -> float:
        return cpu_seconds_of([p.pid for p in self.procs]) if self._cpu_at_stop is None else self._cpu_at_stop

    def stop(self) -> list[int]:
        if self._cpu_at_stop is not None:
            return [p.returncode for p in self.procs]
        self._cpu_at_stop = cpu_seconds_of([p.pid for p in self.procs])
        return super().stop()


def quantile_ms(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile in ms from cumulative histogram buckets, interpolated within its bucket."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower * 1000
            inside = (rank - below) / (cumulative - below) if cumulative > below else 1.0
            return (lower + (bound - lower) * inside) * 1000
        lower, below = bound, cumulative
    return lower * 1000
