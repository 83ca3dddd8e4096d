"""`limits`: fleet-wide limits under a backlog, read from the handlers' own recording, in both
modes.

One queue, three job types (the worker app is bench/limits_app.py): `rated` under `dispatcher
limits set rated --per-second R`, `capped` under `--max-running N`, and `free` with no limit,
enqueued last so that a queue held up by the limited types would show it. Reported per mode: the
starts of `rated` per window and the most in any window of that length (`rate_windows`,
`max_in_any_window`), the most `capped` running at once (`running_peak`, a sweep over start and
end) and when each type finished (`summarize`). What the columns mean: docs/guides/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.core import Result, recording_dir, reset
from bench.fleet import Fleet
from bench.limits_app import JOB_TYPES, RECORD_DIR_ENV
from dispatcher import enqueue_payloads_sync
from dispatcher.devtools.harness import watch_until_done, worker_env

APP = "bench.limits_app:registry"
Run = tuple[str, int, int, int]  # job type, job id, start ns, end ns
NS = 1_000_000_000
# the claim: with a backlog, a window starts at least 0.9 x its rate's jobs
RATE_HELD_SHARE = 0.9
RUNNING_BIN_S = 0.1  # the capped series: the most running in each 0.1 s


def read_recording(directory: Path) -> Iterator[Run]:
    """Every run the workers wrote to `directory` (one <pid>.tsv each)."""
    for path in sorted(directory.glob("*.tsv")):
        for line in path.read_text().splitlines():
            job_type, job_id, start, end = line.split("\t")
            yield job_type, int(job_id), int(start), int(end)


def rate_windows(
    starts_ns: Sequence[int], per_second: float, window_s: float
) -> list[dict[str, Any]]:
    """The starts in each window of `window_s` from the first start, against the rate's jobs per
    window. `backlog`: jobs were still waiting when the window closed (one started after it), so
    the window had work for its whole length; the last window, cut short, does not."""
    if not starts_ns:
        return []
    ordered = sorted(starts_ns)
    t0, last = ordered[0], ordered[-1]
    window_ns, rate_jobs = int(window_s * NS), per_second * window_s
    counts = [0] * ((last - t0) // window_ns + 1)
    for start in ordered:
        counts[(start - t0) // window_ns] += 1
    return [
        {
            "window": i + 1,
            "from_s": round(i * window_s, 3),
            "starts": n,
            "rate_jobs": round(rate_jobs, 3),
            "ratio": round(n / rate_jobs, 3),
            "backlog": last >= t0 + (i + 1) * window_ns,
        }
        for i, n in enumerate(counts)
    ]


def max_in_any_window(starts_ns: Sequence[int], window_s: float) -> int:
    """The most starts in any half-open span [t, t + window_s), wherever it begins (a token bucket
    allows at most burst + rate x window_s in every one)."""
    ordered, window_ns = sorted(starts_ns), int(window_s * NS)
    most, first = 0, 0
    for last, start in enumerate(ordered):
        while ordered[first] <= start - window_ns:
            first += 1
        most = max(most, last - first + 1)
    return most


def _events(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    # An end sorts before a start at the same instant: a slot handed on is not two at once.
    return sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])


def running_peak(intervals: Iterable[tuple[int, int]]) -> int:
    """The most (start, end) intervals open at one instant: a sweep over starts and ends."""
    most = running = 0
    for _, step in _events(intervals):
        running += step
        most = max(most, running)
    return most


def running_series(
    intervals: Iterable[tuple[int, int]], t0_ns: int, bin_s: float, bins: int
) -> list[int]:
    """The most intervals open at once within each of `bins` spans of `bin_s` from `t0_ns`."""
    events, step_ns = _events(intervals), int(bin_s * NS)
    series, running, k = [], 0, 0
    for b in range(bins):
        peak = running  # open as the bin begins
        while k < len(events) and events[k][0] < t0_ns + (b + 1) * step_ns:
            running += events[k][1]
            peak = max(peak, running)
            k += 1
        series.append(peak)
    return series


def mean_running_series(
    intervals: Iterable[tuple[int, int]], t0_ns: int, bin_s: float, bins: int
) -> list[float]:
    """How many intervals were open on average within each of `bins` spans of `bin_s` from
    `t0_ns`."""
    step_ns = int(bin_s * NS)
    busy = [0] * bins
    for start, end in intervals:
        for b in range(max(0, (start - t0_ns) // step_ns), min(bins, (end - t0_ns) // step_ns + 1)):
            lo = t0_ns + b * step_ns
            busy[b] += max(0, min(end, lo + step_ns) - max(start, lo))
    return [round(ns / step_ns, 2) for ns in busy]


def mean_running(intervals: Sequence[tuple[int, int]]) -> float:
    """How many ran at once on average, from the first start to the last end."""
    if not intervals:
        return 0.0
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return sum(e - s for s, e in intervals) / span if span > 0 else 0.0


def per_second_series(starts_ns: Iterable[int], t0_ns: int, seconds: int) -> list[int]:
    series = [0] * seconds
    for start in starts_ns:
        i = (start - t0_ns) // NS
        if 0 <= i < seconds:
            series[i] += 1
    return series


def summarize(
    runs: Iterable[Run],
    *,
    jobs: dict[str, int],
    per_second: float,
    burst_jobs: float,
    max_running: int,
    window_s: float,
) -> dict[str, Any]:
    """The row of one run from the recording: the rate's windows, the cap's peak, when each type
    finished (seconds after the first start of any job), jobs run twice or never; and the series
    the plot draws (starts of `rated` per second; `capped` running per 0.1 s, the most and the
    mean)."""
    by_type: dict[str, list[Run]] = {t: [] for t in JOB_TYPES}
    seen: set[int] = set()
    twice = 0
    for run in runs:
        twice += run[1] in seen
        seen.add(run[1])
        by_type.setdefault(run[0], []).append(run)
    every = [r for rs in by_type.values() for r in rs]
    t0 = min((r[2] for r in every), default=0)
    rated = [r[2] for r in by_type["rated"]]
    capped = [(r[2], r[3]) for r in by_type["capped"]]
    windows = rate_windows(rated, per_second, window_s)
    with_backlog = [w for w in windows if w["backlog"]]
    bound = per_second * window_s + burst_jobs
    most_any = max_in_any_window(rated, window_s)
    peak = running_peak(capped)
    done_s = {
        t: round((max(r[3] for r in rs) - t0) / NS, 2) if rs else None for t, rs in by_type.items()
    }
    capped_span_s = (max(e for _, e in capped) - min(s for s, _ in capped)) / NS if capped else 0.0
    end_s = max(r[3] for r in every) - t0 if every else 0
    bins = int(end_s / (RUNNING_BIN_S * NS)) + 1
    return {
        "per_second": per_second,
        "burst_jobs": burst_jobs,
        "window_s": window_s,
        **{f"{t}_jobs": jobs.get(t, 0) for t in JOB_TYPES},
        "windows_with_backlog": len(with_backlog),
        "min_window_ratio": min((w["ratio"] for w in with_backlog), default=None),
        "max_window_starts": max((w["starts"] for w in windows), default=0),
        "max_starts_any_window": most_any,
        "window_bound": round(bound, 3),
        "rate_within_bound": most_any <= bound,
        "rate_held": bool(with_backlog)
        and all(w["ratio"] >= RATE_HELD_SHARE for w in with_backlog),
        "max_running": max_running,
        "capped_max_running": peak,
        "cap_held": peak <= max_running,
        "capped_mean_running": round(mean_running(capped), 2),
        "capped_jobs_per_s": round(len(capped) / capped_span_s, 1) if capped_span_s else None,
        **{f"{t}_done_s": done_s[t] for t in JOB_TYPES},
        "ran_twice": twice,
        "not_run": max(0, sum(jobs.values()) - len(seen)),
        "windows": windows,
        "rated_starts_per_s": per_second_series(rated, t0, int(end_s // NS) + 1),
        "capped_running": running_series(capped, t0, RUNNING_BIN_S, bins),
        "capped_mean_running_series": mean_running_series(capped, t0, RUNNING_BIN_S, bins),
    }


def window_table(row: dict[str, Any]) -> str:
    """The issue's table for one run: window, starts, the rate's jobs per window, their ratio."""
    lines = [f"{'window':>6} {'from_s':>7} {'starts':>7} {'rate_jobs':>9} {'ratio':>6}  backlog"]
    lines += [
        f"{w['window']:>6} {w['from_s']:>7g} {w['starts']:>7} {w['rate_jobs']:>9g} "
        f"{w['ratio']:>6.3f}  {'yes' if w['backlog'] else 'no (the last jobs)'}"
        for w in row["windows"]
    ]
    return "\n".join(lines)


def job_counts(
    per_second: float,
    burst_jobs: float,
    max_running: int,
    windows: int,
    window_s: float,
    free_jobs: int,
) -> dict[str, int]:
    """Enough `rated` for `windows` full windows at the rate after the first burst, plus a second's
    worth, so the last of them still has a backlog; `capped` for about as long at a slot's turn of
    0.1 s (a 20-50 ms handler, its completion, the next gated claim)."""
    seconds = windows * window_s
    return {
        "rated": round(per_second * (seconds + 1) + burst_jobs),
        "capped": round(max_running * seconds / 0.1),
        "free": free_jobs,
    }


def limits_cli(dsn: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`dispatcher limits ...`, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", "limits", *argv],
        env=worker_env(dsn),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def set_limits(dsn: str, per_second: float, max_running: int) -> float:
    """Clear every limit, set the two of the run; returns the rate's burst (its default)."""
    limits_cli(dsn, "clear", "--all")  # exit 1: there was none
    for argv in (
        ("set", "rated", "--per-second", f"{per_second:g}"),
        ("set", "capped", "--max-running", str(max_running)),
    ):
        done = limits_cli(dsn, *argv)
        if done.returncode != 0:
            raise RuntimeError(f"dispatcher limits {' '.join(argv)}: {done.stdout}{done.stderr}")
    listed = json.loads(limits_cli(dsn, "list", "--json").stdout)
    return float(next(r["burst_jobs"] for r in listed if r["job_type"] == "rated"))


def limits_suite(
    dsn: str,
    result: Result,
    *,
    workers: int,
    modes: list[str],
    per_second: float,
    max_running: int,
    windows: int,
    window_s: float,
    free_jobs: int,
) -> None:
    """One run per mode: limits set, a ready fleet, every job committed at once, drained."""
    for mode in modes:
        label = f"limits {mode} x{workers}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            reset(conn)
            burst = set_limits(dsn, per_second, max_running)
            jobs = job_counts(per_second, burst, max_running, windows, window_s, free_jobs)
            total = sum(jobs.values())
            try:
                with recording_dir(RECORD_DIR_ENV, "bench-limits-") as directory:
                    with Fleet(dsn, mode, workers, app=APP) as fleet:
                        fleet.wait_ready()
                        with conn.transaction():  # the jobs appear at once, when it commits
                            for job_type in JOB_TYPES:  # `free` last: behind the limited ones
                                enqueue_payloads_sync(
                                    conn, job_type, ({} for _ in range(jobs[job_type]))
                                )
                        started = time.monotonic()
                        watch_until_done(
                            conn,
                            fleet,
                            total,
                            label,
                            timeout_s=max(300.0, 5 * windows * window_s),
                            every_s=0.1,
                        )
                        seconds = time.monotonic() - started
                    row = summarize(
                        read_recording(directory),
                        jobs=jobs,
                        per_second=per_second,
                        burst_jobs=burst,
                        max_running=max_running,
                        window_s=window_s,
                    )
            finally:
                limits_cli(dsn, "clear", "--all")
        series = {
            k: row.pop(k)
            for k in (
                "windows",
                "rated_starts_per_s",
                "capped_running",
                "capped_mean_running_series",
            )
        }
        result.add(mode=mode, workers=workers, seconds=round(seconds, 2), **row)
        result.rows[-1].update(series)  # in the JSON, not on the console
        print(window_table(result.rows[-1]), flush=True)
