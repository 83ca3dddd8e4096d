"""A worker app for multi-process tests: every execution is appended to a per-process log file.

`RECORD_DIR/<pid>.log` gets one line per execution, `job_id attempt start end outcome`, written
and flushed when the handler ends (wall clock of this one machine, shared by all the worker
processes, so intervals from different processes compare). The test reads every file afterwards
to prove that no job ran twice and no two executions of one job overlapped.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

from dispatcher import Job, Registry

registry = Registry()

_log = None


def _record(job: Job, start: float, outcome: str) -> None:
    global _log
    if _log is None:
        _log = open(os.path.join(os.environ["RECORD_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
    _log.write(f"{job.id} {job.attempts} {start:.6f} {time.time():.6f} {outcome}\n")


@registry.handler("record")
async def record(job: Job) -> None:
    """Runs 0-2 ms (so executions have a width that could overlap), then records itself."""
    start = time.time()
    await asyncio.sleep(random.random() * 0.002)
    _record(job, start, "ok")


@registry.handler("record_slow")
async def record_slow(job: Job) -> None:
    start = time.time()
    await asyncio.sleep(job.payload.get("s", 1.0))
    _record(job, start, "ok")


@registry.handler("record_sync")
def record_sync(job: Job) -> None:
    start = time.time()
    time.sleep(job.payload.get("s", 0.5))
    _record(job, start, "ok")


@registry.handler("exit_process")
async def exit_process(job: Job) -> None:
    """A poison job that kills its worker outright, as an OOM kill or a segfault would."""
    _record(job, time.time(), "exit")
    _log.flush()  # type: ignore[union-attr]
    os._exit(1)
