"""The worker app of `python -m bench schedules`: SCHEDULES every-second schedules of one no-op
type.

Each worker process keeps (job id, slot, start) per run, the slot from `job.scheduled_for` and
the start from time.time() (the database runs on the same machine here, so the two share a
clock), and writes them to BENCH_SCHEDULES_RECORD_DIR/<pid>.tsv when it exits. bench/schedules.py
reads them.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

from dispatcher import Job, Registry

RECORD_DIR_ENV = "BENCH_SCHEDULES_RECORD_DIR"
SCHEDULES = 5

registry = Registry()
_runs: list[tuple[int, float, float]] = []


@registry.handler("tick")
async def tick(job: Job) -> None:
    _runs.append(
        (job.id, job.scheduled_for.timestamp() if job.scheduled_for else float("nan"), time.time())
    )


for n in range(SCHEDULES):
    registry.schedule(f"tick-{n}", every_s=1, job_type="tick")


def _dump(directory: str) -> None:
    Path(directory, f"{os.getpid()}.tsv").write_text(
        "".join(f"{i}\t{s:.6f}\t{t:.6f}\n" for i, s, t in _runs)
    )


if os.environ.get(RECORD_DIR_ENV):
    atexit.register(_dump, os.environ[RECORD_DIR_ENV])
