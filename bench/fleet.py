"""A fleet of real worker processes for one benchmark run, and what they report.

Each worker is a `dispatcher run` process (the demo app's no-op handler) with a Prometheus port;
at the end of a run the fleet scrapes every worker's claim-latency and poll-cycle histograms
and merges them (quantiles are read from the histogram buckets, interpolated linearly).
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from collections import defaultdict
from typing import Any

from dispatcher.devtools.harness import start_worker, stop_workers

from .core import cpu_seconds_of

APP = "dispatcher.devtools.demo_app:registry"
_BUCKET = re.compile(r'^(dispatcher_\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"(?:,[^}]*)?\}\s+([0-9.e+]+)$')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet:
    def __init__(self, dsn: str, mode: str, workers: int, **settings: Any) -> None:
        self.dsn, self.mode, self.size = dsn, mode, workers
        self.ports = [free_port() for _ in range(workers)]
        base = dict(mode=mode, concurrency=500, batch_size=500, log_level="WARNING", coordinator="postgres",
                    coordinator_lease_s=10, poll_interval_s=0.1)
        base.update(settings)
        self.procs = [start_worker(dsn, APP, metrics_port=port, worker_id=f"bench-{mode}-{i}", **base)
                      for i, port in enumerate(self.ports)]
        self._cpu_at_stop: float | None = None

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def scrape(self, port: int) -> str | None:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            return None

    def wait_ready(self, timeout_s: float = 60) -> None:
        """Every worker answers, and in partitioned mode all 64 buckets are owned (each worker a
        share, up to 64 workers): no run starts mid-rebalance."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            texts = [self.scrape(p) for p in self.ports]
            if all(texts):
                if self.mode != "partitioned":
                    return
                owned = [_gauge(t, "dispatcher_coordinator_owned_buckets") for t in texts]  # type: ignore[arg-type]
                if sum(owned) == 64 and (self.size > 64 or min(owned) > 0):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("worker fleet not ready")
            time.sleep(0.1)

    def check_alive(self) -> None:
        dead = [p.returncode for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a worker process exited (codes {dead})")

    def histograms(self) -> dict[str, list[tuple[float, float]]]:
        """name -> [(upper bound, cumulative count)] summed over the fleet."""
        merged: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for port in self.ports:
            for line in (self.scrape(port) or "").splitlines():
                m = _BUCKET.match(line)
                if m:
                    merged[m[1]][float(m[2])] += float(m[3])
        return {name: sorted(b.items()) for name, b in merged.items()}

    def cpu_seconds(self) -> float:
        return cpu_seconds_of([p.pid for p in self.procs]) if self._cpu_at_stop is None else self._cpu_at_stop

    def stop(self) -> None:
        if self._cpu_at_stop is None:
            self._cpu_at_stop = cpu_seconds_of([p.pid for p in self.procs])
            stop_workers(self.procs)


def _gauge(text: str, name: str) -> float:
    """The value of gauge `name`, summed over its labels (owned buckets are per queue)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


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
