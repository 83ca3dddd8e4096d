"""A fleet of real worker processes for one benchmark run, and what they report.

Each worker is a `dispatcher run` process (the demo app's no-op handler) with a Prometheus port;
at the end of a run the fleet scrapes every worker's claim-latency and poll-cycle histograms
and merges them (quantiles are read from the histogram buckets, interpolated linearly).
"""

from __future__ import annotations

import re
import socket
import subprocess
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


# The settings every scenario runs at unless it asks for the defaults a user gets (profile
# "defaults": concurrency 100, poll 1 s, coordinator lease 10 s; see dispatcher/config.py).
TUNED = dict(concurrency=500, batch_size=500, coordinator="postgres", coordinator_lease_s=10, poll_interval_s=0.1)
PROFILES: dict[str, dict[str, Any]] = {"bench": TUNED, "defaults": {}}


class Fleet:
    def __init__(self, dsn: str, mode: str, workers: int, *, profile: str = "bench", **settings: Any) -> None:
        self.dsn, self.mode, self.size = dsn, mode, workers
        self.settings = dict(mode=mode, log_level="WARNING", **PROFILES[profile])
        self.settings.update(settings)
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._spawned = 0
        for _ in range(workers):
            self.spawn()
        self._cpu_at_stop: float | None = None
        self._cpu_of_retired = 0.0

    def spawn(self) -> int:
        """Start one more worker process; returns its index in `procs`."""
        port = free_port()
        self.procs.append(start_worker(self.dsn, APP, metrics_port=port, worker_id=f"bench-{self.mode}-{self._spawned}",
                                       **self.settings))
        self.ports.append(port)
        self._spawned += 1
        return len(self.procs) - 1

    def retire(self, index: int, timeout_s: float = 60) -> float:
        """SIGTERM worker `index` (as a rollout does) and wait for it to exit; returns the seconds
        that took. Its CPU so far is kept in the fleet's total."""
        proc = self.procs.pop(index)
        self.ports.pop(index)
        self._cpu_of_retired += cpu_seconds_of([proc.pid])
        started = time.monotonic()
        code = stop_workers([proc], timeout_s)[0]
        if code != 0:
            raise RuntimeError(f"a retired worker exited with code {code}")
        return time.monotonic() - started

    def ready(self, index: int) -> bool:
        """Worker `index` answers /readyz with 200 (running, database reachable, buckets owned)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[index]}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

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
                if sum(owned) == 64 and (len(self.procs) > 64 or min(owned) > 0):
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
        if self._cpu_at_stop is None:
            return self._cpu_of_retired + cpu_seconds_of([p.pid for p in self.procs])
        return self._cpu_at_stop

    def stop(self) -> None:
        if self._cpu_at_stop is None:
            self._cpu_at_stop = self.cpu_seconds()
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
