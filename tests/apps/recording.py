"""A worker app for multi-process tests: every execution is appended to a per-process log file.

`RECORD_DIR/<pid>.log` gets two lines per execution (wall clock of this one machine, shared by
all the worker processes, so intervals from different processes compare):
- when the handler STARTS: `job_id attempt start - started`;
- when it ENDS, however it ends: `job_id attempt start end outcome`, where outcome is `ok`,
  `cancelled`, the name of the exception it raised, or `exit` (exit_process, just before it
  takes its process down).
Each line is written with one write() and flushed at once, so a process killed or paused
mid-job leaves the start line of each execution it had begun and no end line: that is how a
test sees executions that started but never ended. tests/helpers.read_executions pairs the
lines up; the test reads every file afterwards to prove that no job ran twice and no two
executions of one job overlapped.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from dispatcher import Job, Registry

registry = Registry()

_log: IO[str] | None = None
_log_lock = threading.Lock()  # sync handlers record from the worker's thread pool


def _write(line: str) -> None:
    global _log
    with _log_lock:
        if _log is None:
            _log = open(  # noqa: SIM115  (kept open for the process's life, one per pid)
                os.path.join(os.environ["RECORD_DIR"], f"{os.getpid()}.log"), "a", buffering=1
            )
        _log.write(line)  # line-buffered: one write() per line, before the handler goes on


@contextmanager
def recorded(job: Job) -> Iterator[None]:
    """Record the start of an execution now and its end (with how it ended) when the block exits.
    A process that dies inside the block leaves only the start line."""
    start = time.time()
    _write(f"{job.id} {job.attempts} {start:.6f} - started\n")
    outcome = "ok"
    try:
        yield
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        _write(f"{job.id} {job.attempts} {start:.6f} {time.time():.6f} {outcome}\n")


@registry.handler("record")
async def record(job: Job) -> None:
    """Runs 0-2 ms (so executions have a width that could overlap)."""
    with recorded(job):
        await asyncio.sleep(random.random() * 0.002)


@registry.handler("record_slow")
async def record_slow(job: Job) -> None:
    with recorded(job):
        await asyncio.sleep(job.payload.get("s", 1.0))


@registry.handler("record_sync")
def record_sync(job: Job) -> None:
    with recorded(job):
        time.sleep(job.payload.get("s", 0.5))


@registry.handler("record_keyed")
async def record_keyed(job: Job) -> None:
    """An ordered job: its payload carries its ordering key and its sequence number within the key
    (tests/chaos/support.enqueue_keyed) and how long it runs, `s` seconds. A payload whose key is
    not the job's ordering key is a test's own mistake: it fails loudly."""
    with recorded(job):
        if job.payload.get("key") != job.ordering_key:
            raise AssertionError(
                f"job {job.id}: payload key {job.payload.get('key')!r} is not {job.ordering_key!r}"
            )
        await asyncio.sleep(job.payload.get("s", 0.05))


@registry.handler("exit_process")
async def exit_process(job: Job) -> None:
    """A poison job that kills its worker outright, as an OOM kill or a segfault would."""
    start = time.time()
    _write(f"{job.id} {job.attempts} {start:.6f} - started\n")
    _write(f"{job.id} {job.attempts} {start:.6f} {time.time():.6f} exit\n")
    os._exit(1)
