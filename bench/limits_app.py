"""The worker app of `python -m bench limits`: three job types in one queue, recording when each
ran.

`rated` (a rate limit) and `free` (no limit) yield to the event loop once; `capped` (a
max-running limit) sleeps 20-50 ms, drawn from its job id, so that several run at once and the
limit binds. As bench/keyed_app.py does, each worker process keeps (job type, job id, start, end)
per job, the times from CLOCK_MONOTONIC (one clock for every process of the machine), and writes
them to BENCH_LIMITS_RECORD_DIR/<pid>.tsv when it exits, after the measured window.
bench/limits.py reads them.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import time
from pathlib import Path

from dispatcher import Job, Registry

RECORD_DIR_ENV = "BENCH_LIMITS_RECORD_DIR"
JOB_TYPES = ("rated", "capped", "free")
CAPPED_SLEEP_S = (0.020, 0.050)

registry = Registry()
_runs: list[tuple[str, int, int, int]] = []


async def _recorded(job: Job, sleep_s: float) -> None:
    start = time.monotonic_ns()
    await asyncio.sleep(sleep_s)
    _runs.append((job.job_type, job.id, start, time.monotonic_ns()))


@registry.handler("rated")
async def rated(job: Job) -> None:
    await _recorded(job, 0)


@registry.handler("capped")
async def capped(job: Job) -> None:
    await _recorded(job, random.Random(job.id).uniform(*CAPPED_SLEEP_S))


@registry.handler("free")
async def free(job: Job) -> None:
    await _recorded(job, 0)


def _dump(directory: str) -> None:
    lines = "".join(f"{t}\t{i}\t{s}\t{e}\n" for t, i, s, e in _runs)
    Path(directory, f"{os.getpid()}.tsv").write_text(lines)


if os.environ.get(RECORD_DIR_ENV):
    atexit.register(_dump, os.environ[RECORD_DIR_ENV])
