"""Shared test helpers: SQL peeks, waiting for a condition (never fixed sleeps), worker
processes."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import subprocess
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from dispatcher.devtools import harness
from dispatcher.runtime.maintenance import Reaper
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.settings.sections import MaintenanceSettings

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def fetchall(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def fetchval(dsn: str, sql: str, params: Any = None) -> Any:
    rows = fetchall(dsn, sql, params)
    return rows[0][0] if rows else None


def status_counts(dsn: str) -> dict[str, int]:
    return dict(fetchall(dsn, "SELECT status, count(*) FROM dispatcher_jobs GROUP BY status"))


# --------------------------------------------------------------------------- waiting for a
# condition The one place tests wait for a condition: poll a predicate until it holds, fail after a
# deadline saying what was awaited. Never a fixed sleep. `timeout_s` is seconds from now, or a
# `Deadline` shared by several waits (one budget for a sequence of steps).

What = str | Callable[[], str]  # what is awaited; a callable is asked only when the wait times out


class Deadline:
    """A time budget that starts now; several waits may share it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def passed(self) -> bool:
        return time.monotonic() > self.at

    def timed_out(self, what: What) -> AssertionError:
        text = what() if callable(what) else what
        return AssertionError(f"timed out after {self.timeout_s} s waiting for: {text}")


def _deadline(timeout_s: float | Deadline) -> Deadline:
    return timeout_s if isinstance(timeout_s, Deadline) else Deadline(timeout_s)


def wait_until(
    predicate: Callable[[], T], timeout_s: float | Deadline, what: What, interval_s: float = 0.05
) -> T:
    """Poll `predicate` until it returns something truthy (returned); fail with `what` after the
    deadline."""
    deadline = _deadline(timeout_s)
    while True:
        value = predicate()
        if value:
            return value
        if deadline.passed():
            raise deadline.timed_out(what)
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float | Deadline,
    what: What,
    interval_s: float = 0.02,
) -> T:
    """`wait_until` on the running event loop: `predicate` may be sync or return an awaitable."""
    deadline = _deadline(timeout_s)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if deadline.passed():
            raise deadline.timed_out(what)
        await asyncio.sleep(interval_s)


def start_worker(
    dsn: str,
    record_dir: Path | None = None,
    app: str = "tests.apps.recording:registry",
    log_path: Path | None = None,
    **settings: Any,
) -> subprocess.Popen[bytes]:
    """A real `dispatcher run` process with the recording app importable."""
    extra = {"PYTHONPATH": str(ROOT)}
    if record_dir is not None:
        extra["RECORD_DIR"] = str(record_dir)
    return harness.start_worker(dsn, app, log=log_path, cwd=ROOT, extra_env=extra, **settings)


stop_workers = harness.stop_workers


free_port = harness.free_port  # start_serving_worker tries another if a worker loses the race


def http_get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of GET http://127.0.0.1:port/path; None if nothing answered."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=timeout_s
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()
    except OSError:
        return None


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metric_samples(text: str) -> Samples:
    """(sample name, sorted labels) -> value of a Prometheus text page, by prometheus_client's
    parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def collected(collector: Any) -> Samples:
    """What `collector` exports when scraped, as metric_samples."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    return metric_samples(generate_latest(registry).decode())


def start_serving_worker(
    dsn: str,
    log_path: Path,
    *,
    record_dir: Path | None = None,
    app: str = "tests.apps.recording:registry",
    tries: int = 3,
    **settings: Any,
) -> tuple[subprocess.Popen[bytes], int]:
    """A worker process serving /metrics, /livez and /readyz on a free port: (process, port)
    once /livez answers. A port taken between free_port() and the worker's bind makes the worker
    exit 1 naming DISPATCHER_METRICS_PORT: then another port is tried."""
    for _ in range(tries):
        port = free_port()
        proc = start_worker(
            dsn, record_dir, app=app, log_path=log_path, metrics_port=port, **settings
        )
        wait_until(
            lambda proc=proc, port=port: proc.poll() is not None or http_get(port, "/livez"),
            60,
            lambda port=port: f"/livez on port {port}: {log_path.read_text()[-2000:]}",
        )
        if proc.poll() is None:
            return proc, port
        if "DISPATCHER_METRICS_PORT" not in log_path.read_text():
            raise AssertionError(f"worker exited {proc.returncode}: {log_path.read_text()[-2000:]}")
    raise AssertionError(f"no free port for the worker's HTTP server in {tries} tries")


@dataclass(frozen=True)
class Execution:
    """One run of a handler, from tests/apps/recording.py's lines. `end` and `outcome` are None
    for an execution that started and never ended (its process was killed or is paused)."""

    job_id: int
    attempt: int
    start: float
    end: float | None
    pid: int
    outcome: str | None = None


def _complete_lines(path: Path) -> list[str]:
    """The file's whole lines: a line still being written by a live process is left for later."""
    text = path.read_text()
    return text.split("\n")[:-1]  # the last piece is "" or a partial line


def read_executions(
    record_dir: Path, *, include_unfinished: bool = False, pid: int | None = None
) -> dict[int, list[Execution]]:
    """job id -> its executions (only process `pid`'s, if given). By default only executions
    that ended (the record of every test written before start lines existed); with
    `include_unfinished`, also those that started and never ended, with end=None (see
    `overlapping` for how they count)."""
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for path in record_dir.glob("*.log" if pid is None else f"{pid}.log"):
        writer = int(path.stem)  # the worker process that wrote the file
        started: dict[tuple[str, str, str], None] = {}
        for line in _complete_lines(path):
            job_id, attempt, start, end, outcome = line.split()
            if end == "-":
                started[(job_id, attempt, start)] = None
                continue
            started.pop((job_id, attempt, start), None)
            by_job[int(job_id)].append(
                Execution(int(job_id), int(attempt), float(start), float(end), writer, outcome)
            )
        if include_unfinished:
            for job_id, attempt, start in started:
                by_job[int(job_id)].append(
                    Execution(int(job_id), int(attempt), float(start), None, writer)
                )
    return by_job


def unfinished(executions: dict[int, list[Execution]]) -> list[Execution]:
    """Executions that started and never ended (read with include_unfinished=True)."""
    return [run for runs in executions.values() for run in runs if run.end is None]


def overlapping(
    executions: dict[int, list[Execution]], cut_at: Mapping[int, float] | None = None
) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one job that ran at the same time (wall clock).

    An execution that never ended counts as running until `cut_at[pid]` (the time.time() its
    process was killed), or, for a pid not in `cut_at`, forever: nothing shows it stopped, so any
    later execution of the job overlaps it. A paused process's handlers are not cut: they go on
    after SIGCONT and record their end."""
    cut_at = cut_at or {}
    pairs = []
    for runs in executions.values():
        runs = sorted(runs, key=lambda e: e.start)
        for i, a in enumerate(runs):
            a_end = a.end if a.end is not None else cut_at.get(a.pid, math.inf)
            pairs += [(a, b) for b in runs[i + 1 :] if b.start < a_end]
    return pairs


def most_at_once(
    executions: dict[int, list[Execution]],
    job_ids: set[int] | None = None,
    cut_at: Mapping[int, float] | None = None,
) -> int:
    """The largest number of executions (of `job_ids`, or of every job) that ran at one instant
    (wall clock). An execution that never ended runs until `cut_at[pid]`, or for ever (as in
    `overlapping`)."""
    cut_at = cut_at or {}
    events = []
    for job_id, runs in executions.items():
        if job_ids is not None and job_id not in job_ids:
            continue
        for run in runs:
            end = run.end if run.end is not None else cut_at.get(run.pid, math.inf)
            events += [(run.start, 1), (end, -1)]
    most = now = 0
    # at a tie an end (-1) sorts before a start: touching is not overlapping
    for _, step in sorted(events):
        now += step
        most = max(most, now)
    return most


def key_order_violations(
    executions: dict[int, list[Execution]],
    keys: Mapping[int, tuple[str, int]],
    cut_at: Mapping[int, float] | None = None,
) -> list[str]:
    """What broke ordering keys' promise in a recording, described (none: it held).

    `keys`: job id -> (its ordering key, its sequence number in the key, as enqueued). For every
    key, its jobs in id order: their sequence numbers rise (enqueue order is id order); each job
    ran to its end ('ok') at least once; and job n+1's first run started after every run of job
    n had ended, so no runs of two jobs of a key ever overlap. Runs of ONE job may overlap each
    other (a stalled owner's run against its re-run: `overlapping` judges those). A run that never
    ended lasts until `cut_at[pid]` (its process was killed then), else forever."""
    cut_at = cut_at or {}
    by_key: dict[str, list[int]] = defaultdict(list)
    for job_id in sorted(keys):
        by_key[keys[job_id][0]].append(job_id)
    problems = []
    for key, ids in by_key.items():
        seqs = [keys[job_id][1] for job_id in ids]
        if seqs != sorted(seqs):
            problems.append(f"key {key}: ids {ids} are not in enqueue order {seqs}")
        for job_id in ids:
            if not any(run.outcome == "ok" for run in executions.get(job_id, [])):
                problems.append(
                    f"key {key}: job {job_id} never ran to its end: {executions.get(job_id, [])}"
                )
        for earlier, later in itertools.pairwise(ids):
            runs, next_runs = executions.get(earlier, []), executions.get(later, [])
            if not runs or not next_runs:
                continue
            ended = max(
                run.end if run.end is not None else cut_at.get(run.pid, math.inf) for run in runs
            )
            started = min(run.start for run in next_runs)
            if started < ended:
                problems.append(
                    f"key {key}: job {later} started at {started:.3f}, {ended - started:.3f} s "
                    f"before job {earlier} (before it in the key) had ended: {runs} / {next_runs}"
                )
    return problems


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, the root first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def run_async(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


def analyze_if_stale(dsn: str) -> None:
    """One PlannerStats tick (store.jobs_analyze_if_stale) as the role of `dsn`, on a store of
    its own."""
    from dispatcher.db.store import JobStore

    async def tick() -> None:
        store = JobStore(dsn, "w")
        try:
            await store.jobs_analyze_if_stale()
        finally:
            await store.close()

    run_async(tick())


async def run_worker_until(
    worker: Any,
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    grace_s: float | None = None,
) -> Any:
    """Run an in-process Worker until `predicate()` (a sync DB check, run in a thread) holds."""
    task = asyncio.create_task(worker.run())

    async def holds() -> Any:
        value = await asyncio.to_thread(predicate)
        if not value and task.done():
            task.result()
            raise AssertionError(f"worker exited before: {what}")
        return value

    try:
        return await wait_until_async(holds, timeout_s, what, interval_s=0.05)
    finally:
        worker.stop(grace_s=grace_s)
        await task


# Every running -> queued transition (a retry, or a reaped lease) with the database time it was
# written at, so a test can check that each retry was scheduled in the future.
RETRY_LOG = """
CREATE TABLE retry_log (job_id bigint, attempts int, run_at timestamptz, written_at timestamptz);
CREATE FUNCTION log_retry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO retry_log VALUES (NEW.id, NEW.attempts, NEW.run_at, now());
    RETURN NEW;
END $$;
CREATE TRIGGER log_retry AFTER UPDATE ON dispatcher_jobs FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status = 'queued') EXECUTE FUNCTION log_retry();
"""


async def reap_and_claim_again(dsn: str, old: Any, new: Any) -> tuple[list[Any], list[Any]]:
    """The takeover fencing tests start from: store `old` claims every due job of the default
    queue, its leases run out, `new`'s reaper requeues them and `new` claims them again.
    Returns (the stale claim's jobs, the fresh claim's)."""
    everything = tuple(range(64))
    stale = (await old.jobs_claim("default", 10_000, 30, everything)).jobs
    conn = await old.connection()
    await conn.execute("UPDATE dispatcher_jobs SET lease_expires_at = now() - interval '1 s'")
    settings = MaintenanceSettings(reaper_interval_s=1, history=False, table_sample_interval_s=15)
    reaper = Reaper(new, RetryPolicy(1.0, 1.0), settings, on_reaped=lambda: None)
    await reaper.tick()
    assert reaper.reaped == len(stale)
    assert set(fetchall(dsn, "SELECT status, locked_by FROM dispatcher_jobs")) == {
        ("queued", "old")
    }
    # the retry's backoff has passed
    await conn.execute("UPDATE dispatcher_jobs SET run_at = now()")
    fresh = (await new.jobs_claim("default", 10_000, 30, everything)).jobs
    assert sorted(j.id for j in fresh) == sorted(j.id for j in stale)
    return stale, fresh
