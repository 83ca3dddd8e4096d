"""A fleet of real worker processes for one benchmark run, and what they report.

Each worker is a `dispatcher run` process (the demo app's no-op handler) with a Prometheus port;
at the end of a run the fleet scrapes every worker's claim-latency and poll-cycle histograms
and merges them (quantiles are read from the histogram buckets, interpolated linearly).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.core import cpu_seconds_of
from dispatcher.devtools import harness
from dispatcher.devtools.harness import http_text

APP = "dispatcher.devtools.demo_app:registry"
_BUCKET = re.compile(
    r'^(dispatcher_\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"(?:,[^}]*)?\}\s+([0-9.e+]+)$'
)


# The settings every scenario runs at unless it asks for the defaults a user gets (profile
# "defaults": concurrency 100, poll 1 s, coordinator lease 10 s; see dispatcher/settings/config.py).
TUNED = dict(
    concurrency=500,
    batch_size=500,
    coordinator="postgres",
    coordinator_lease_s=10,
    poll_interval_s=0.1,
)
PROFILES: dict[str, dict[str, Any]] = {"bench": TUNED, "defaults": {}}


class Fleet(harness.Fleet):
    """The shared fleet (readiness, liveness, stop, rollout steps) with the benchmark's settings
    (or the defaults: `profile`), its histograms and its CPU seconds. `app`: another worker app
    than the demo's no-op (bench/keyed_app.py)."""

    def __init__(
        self,
        dsn: str,
        mode: str,
        workers: int,
        *,
        profile: str = "bench",
        app: str = APP,
        **settings: Any,
    ) -> None:
        base = dict(log_level="WARNING", **PROFILES[profile])
        base.update(settings)
        # first: a failed start stops the workers already started
        self._cpu_at_stop: float | None = None
        self._cpu_of_retired = 0.0
        # Their warnings and errors go to a file each, so that a worker that exits mid-run is
        # reported with the end of its log (harness.Fleet.check_alive), not with its exit code
        # alone.
        logs = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-logs-"))
        super().__init__(
            dsn, app, mode, workers, worker_id_prefix=f"bench-{mode}", log_dir=logs, **base
        )

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

    def counter(self, name: str) -> float:
        """A counter (label-free) summed over the fleet, e.g. dispatcher_jobs_stolen_total."""
        total = 0.0
        for port in self.ports:
            for line in (http_text(port, "/metrics") or "").splitlines():
                if line.startswith(name + " "):
                    total += float(line.split()[1])
        return total

    def cpu_seconds(self) -> float:
        if self._cpu_at_stop is None:
            return self._cpu_of_retired + cpu_seconds_of([p.pid for p in self.procs])
        return self._cpu_at_stop

    def retire(self, index: int, timeout_s: float = 60) -> int:
        # before it exits: /proc goes with it
        self._cpu_of_retired += cpu_seconds_of([self.procs[index].pid])
        return super().retire(index, timeout_s)

    def kill(self, index: int) -> tuple[int, float]:
        """SIGKILL worker `index`, a crash: no shutdown, its claims left for their leases to
        expire (bench/citus.py). Returns its pid and the time.time() it was killed at."""
        proc = self.procs[index]
        self._cpu_of_retired += cpu_seconds_of([proc.pid])  # before it exits: /proc goes with it
        proc.kill()
        killed_at = time.time()
        proc.wait()
        del self.procs[index], self.ports[index], self.logs[index]
        return proc.pid, killed_at

    def stop(self) -> list[int]:
        if self._cpu_at_stop is not None:
            return [p.returncode for p in self.procs]
        self._cpu_at_stop = self.cpu_seconds()
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
