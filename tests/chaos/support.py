"""Real `dispatcher run` processes for fault tests: signals, pauses, log waits, exit bounds.

`Workers` (the `workers` fixture) starts them with the faulty app (tests/apps/faulty.py: every
recording handler plus the misbehaving ones), each recording its executions in one shared
RECORD_DIR, and kills whatever is left at teardown. `WorkerProcess` is one of them.
"""

from __future__ import annotations

import codecs
import random
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from dispatcher import enqueue_payloads_sync
from tests.helpers import (
    Execution,
    fetchall,
    key_order_violations,
    read_executions,
    start_worker,
    status_counts,
    wait_until,
)

DEFAULT_APP = "tests.apps.faulty:registry"
# Fast reactions, so a test sees a death or a reap within about a second: idle poll 0.2 s,
# completions written within 20 ms, expired leases reaped every 0.3 s (jittered).
FAST: dict[str, Any] = dict(poll_interval_s=0.2, flush_interval_s=0.02, reaper_interval_s=0.3)
DEFAULT_SHUTDOWN_GRACE_S = 30.0  # dispatcher's own default, for a worker started without one
# What a graceful exit may take beyond the grace period: the final flush, leaving the group and
# closing ~5 connections take well under 1 s on an idle machine; 10 s covers a loaded 2-core one.
EXIT_ALLOWANCE_S = 10.0
_LOG_TAIL_LINES = 40


def _state(pid: int) -> str | None:
    """The process state letter from /proc (R, S, T = stopped, Z ...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


class WorkerProcess:
    """One worker process. Times returned are time.time() (wall clock, as in the execution
    records) or time.monotonic() where said."""

    def __init__(
        self,
        name: str,
        dsn: str,
        record_dir: Path,
        log_path: Path,
        *,
        app: str = DEFAULT_APP,
        **settings: Any,
    ) -> None:
        self.name = name
        self.dsn = dsn
        self.settings = settings
        self.log_path = log_path
        self.record_dir = record_dir
        self._proc = start_worker(dsn, record_dir, app=app, log_path=log_path, **settings)
        self._log = ""
        self._log_offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.paused = False

    def __repr__(self) -> str:
        return f"WorkerProcess({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def shutdown_bound_s(self) -> float:
        """How long after SIGTERM this worker may take to exit: its grace period plus the
        allowance for flushing and closing."""
        return (
            float(self.settings.get("shutdown_grace_s", DEFAULT_SHUTDOWN_GRACE_S))
            + EXIT_ALLOWANCE_S
        )

    def executions(self, *, include_unfinished: bool = True) -> dict[int, list[Execution]]:
        """This process's executions only (one file read: cheap enough to poll)."""
        return read_executions(self.record_dir, include_unfinished=include_unfinished, pid=self.pid)

    def running_handlers(self) -> list[Execution]:
        """Its executions that have started and not ended: handlers mid-run right now."""
        return [run for runs in self.executions().values() for run in runs if run.end is None]

    # -- its log -----------------------------------------------------------------------------------

    def log_text(self) -> str:
        """Everything it has logged so far (read incrementally: only new bytes each call)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except FileNotFoundError:
            return self._log
        self._log_offset += len(data)
        self._log += self._decoder.decode(data)
        return self._log

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_log(self, pattern: str, timeout_s: float, *, start: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the log from character `start` (e.g. a previous
        match's .end()); fails with the log tail if the process exits or the deadline passes."""
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            exited = self._proc.poll() is not None  # before reading: its last lines are then in
            match = regex.search(self.log_text(), start)
            if match is None and exited:
                raise AssertionError(
                    f"{self.name} exited with {self._proc.returncode} before its log matched "
                    f"{pattern!r}; log tail:\n{self.log_tail()}"
                )
            return match

        return wait_until(
            found,
            timeout_s,
            lambda: f"{self.name}'s log to match {pattern!r}; log tail:\n{self.log_tail()}",
        )

    # -- signals -----------------------------------------------------------------------------------

    def signal(self, sig: int) -> float:
        """Send `sig`; returns time.monotonic() just after (the `after` of exited_within)."""
        self._proc.send_signal(sig)
        return time.monotonic()

    def kill(self) -> float:
        """SIGKILL and reap it; returns the time.time() by which it was certainly dead (for
        overlapping()'s cut_at: none of its executions ran past it)."""
        self._proc.kill()
        self._proc.wait()
        self.paused = False
        return time.time()

    def pause(self) -> float:
        """SIGSTOP, and wait until the kernel shows it stopped; returns the time.time() by which
        it certainly was (its connections stay open: to the database it looks alive but stalled)."""
        self._proc.send_signal(signal.SIGSTOP)
        self.paused = True
        wait_until(
            lambda: _state(self.pid) in ("T", None),
            5,
            f"{self.name} to show as stopped",
            interval_s=0.005,
        )
        return time.time()

    def resume(self) -> float:
        """SIGCONT; returns the time.time() just before it, so everything the process does after
        resuming happens after the returned time."""
        resumed_at = time.time()
        self._proc.send_signal(signal.SIGCONT)
        self.paused = False
        return resumed_at

    # -- its exit ----------------------------------------------------------------------------------

    def wait_exit(self, timeout_s: float) -> int:
        """Its exit code; if it is still running after `timeout_s`, SIGKILL it and fail with the
        log tail."""
        try:
            return self._proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            paused = self.paused
            self.kill()
            raise AssertionError(
                f"{self.name} (pid {self.pid}{', paused' if paused else ''}) still ran "
                f"{timeout_s:.1f} s later and was killed; log tail:\n{self.log_tail()}"
            ) from None

    def exited_within(self, bound_s: float, after: float) -> int:
        """Its exit code, if it exits within `bound_s` of `after` (a time.monotonic(), e.g. from
        signal()); otherwise SIGKILL it and fail with the log tail."""
        try:
            return self.wait_exit(after + bound_s - time.monotonic())
        except AssertionError as exc:
            raise AssertionError(
                f"{self.name} did not exit within its bound of {bound_s:g} s: {exc}"
            ) from None

    def stop(self) -> int:
        """SIGTERM, then its exit code once it exits within its shutdown bound."""
        return self.exited_within(self.shutdown_bound_s, self.signal(signal.SIGTERM))


class Workers:
    """Worker processes of one test, sharing its record dir; teardown kills any left."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.record_dir = tmp_path / "records"
        self.record_dir.mkdir(exist_ok=True)
        self.started: list[WorkerProcess] = []

    def start(
        self, dsn: str, name: str, *, app: str = DEFAULT_APP, **settings: Any
    ) -> WorkerProcess:
        """A worker with worker_id `name`, FAST settings unless overridden, logging to
        <name>.out."""
        worker = WorkerProcess(
            name,
            dsn,
            self.record_dir,
            self.dir / f"{name}.out",
            app=app,
            **{**FAST, "worker_id": name, **settings},
        )
        self.started.append(worker)
        return worker

    def stop_all(self) -> dict[str, int]:
        """SIGTERM every live worker at once; name -> exit code, each within its shutdown bound."""
        live = [w for w in self.started if w.alive()]
        for worker in live:
            if worker.paused:
                worker.resume()
        sent = {w.name: w.signal(signal.SIGTERM) for w in live}
        return {w.name: w.exited_within(w.shutdown_bound_s, sent[w.name]) for w in live}

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.alive():
                worker.kill()

    def executions(self, *, include_unfinished: bool = True) -> dict[int, list[Execution]]:
        return read_executions(self.record_dir, include_unfinished=include_unfinished)

    def log_tails(self) -> str:
        return "\n".join(
            f"--- {w.name} (pid {w.pid}, exit {w.returncode}):\n{w.log_tail()}"
            for w in self.started
        )


# --------------------------------------------------------------------------- jobs


def enqueue(
    dsn: str, job_type: str, n: int, payload: dict[str, Any] | None = None, **options: Any
) -> int:
    """n jobs of `job_type`, all with `payload`, in one COPY; `options` as enqueue_payloads_sync's
    (jitter_s, max_attempts, priority ...)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_payloads_sync(conn, job_type, [payload or {}] * n, **options)


def ride_out_a_redis_outage(
    dsn: str, procs: list[WorkerProcess], redis: Any, jobs: int, during: int
) -> None:
    """Kill `redis` (the workers' coordinator) mid-drain: each worker falls back to SKIP LOCKED
    claims, `during` more jobs complete while it is down, then it comes back and each worker says
    so. Fails if the drain of `jobs` ended before the workers degraded."""
    redis.kill()
    down = {w.name: w.wait_for_log("falling back to SKIP LOCKED", 3 + 10) for w in procs}
    done = status_counts(dsn).get("completed", 0)
    assert done < jobs, "the drain was over before the workers degraded"
    wait_until(
        lambda: status_counts(dsn).get("completed", 0) >= done + during,
        30,
        "jobs keep completing while Redis is down",
    )
    redis.start_again()
    for worker in procs:
        worker.wait_for_log("coordinator backend is back", 20, start=down[worker.name].end())


def running_ids(dsn: str, worker: str) -> set[int]:
    """Jobs the database shows running under `worker`."""
    return {
        job_id
        for (job_id,) in fetchall(
            dsn,
            "SELECT id FROM dispatcher_jobs WHERE status = 'running' AND locked_by = %s",
            (worker,),
        )
    }


def started_by(executions: dict[int, list[Execution]], pid: int) -> dict[int, Execution]:
    """job id -> an execution of it by process `pid` (the latest, if several)."""
    out: dict[int, Execution] = {}
    for job_id, runs in executions.items():
        for run in sorted(runs, key=lambda e: e.start):
            if run.pid == pid:
                out[job_id] = run
    return out


# --------------------------------------------------------------------------- ordered jobs


def enqueue_keyed(
    dsn: str,
    keys: int,
    per_key: int,
    s: float | tuple[float, float] = 0.05,
    *,
    first_seq: int = 0,
    prefix: str = "key",
    **options: Any,
) -> int:
    """`per_key` record_keyed jobs for each of `keys` ordering keys (prefix0, prefix1 ...), in one
    COPY, the keys interleaved (a key's jobs are not neighbours by id) and numbered first_seq,
    first_seq + 1 ... within their key. Each runs `s` seconds, or a random time in the (low, high)
    range `s`, so that runs have widths that could overlap."""

    def seconds() -> float:
        return s if isinstance(s, (int, float)) else random.uniform(*s)

    payloads = [
        {"key": f"{prefix}{k}", "seq": first_seq + i, "s": seconds()}
        for i in range(per_key)
        for k in range(keys)
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_payloads_sync(
            conn, "record_keyed", payloads, ordering_keys=[p["key"] for p in payloads], **options
        )


def keyed_jobs(dsn: str) -> dict[int, tuple[str, int]]:
    """job id -> (ordering key, sequence number) of every keyed job, checking that each job's
    payload names its own key."""
    rows = fetchall(
        dsn,
        "SELECT id, ordering_key, payload->>'key', (payload->>'seq')::int FROM dispatcher_jobs "
        "WHERE ordering_key IS NOT NULL",
    )
    wrong = [row for row in rows if row[1] != row[2]]
    assert not wrong, f"payload keys that are not the jobs' ordering keys: {wrong[:5]}"
    return {job_id: (key, seq) for job_id, key, _, seq in rows}


def assert_keys_in_order(
    dsn: str, executions: dict[int, list[Execution]], cut_at: Mapping[int, float] | None = None
) -> dict[int, tuple[str, int]]:
    """Every keyed job completed, and the recording kept each key's order (key_order_violations);
    returns keyed_jobs."""
    keys = keyed_jobs(dsn)
    left = fetchall(
        dsn,
        "SELECT id, status, ordering_key FROM dispatcher_jobs WHERE status <> 'completed' LIMIT 10",
    )
    assert not left, f"jobs not completed: {left}"
    problems = key_order_violations(executions, keys, cut_at)
    assert not problems, f"{len(problems)} breaches of key order, the first:\n" + "\n".join(
        problems[:5]
    )
    return keys


def keys_run_by(
    executions: dict[int, list[Execution]], keys: Mapping[int, tuple[str, int]], pid: int
) -> set[str]:
    """The keys of which process `pid` ran at least one job."""
    return {
        keys[job_id][0]
        for job_id, runs in executions.items()
        if job_id in keys and any(r.pid == pid for r in runs)
    }
