"""The worker app of `python -m bench citus_faults`: a no-op handler that records each run.

Each worker process appends two lines per execution to BENCH_CITUS_RECORD_DIR/<pid>.log: when the
handler starts (`job_id attempt start -`) and when it ends (`job_id attempt start end`), wall clock
(time.time(): one clock for every process of the machine). Unlike bench/keyed_app.py, which writes
its list at exit, every line is written at once: a process killed by SIGKILL leaves the start
line of each run it had begun, and the runs it had finished, which bench/citus.py needs to tell
a killed worker's cut runs from a job run twice. The handler yields to the event loop once
between its two lines, so that two runs of one job at once would overlap in the record.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import IO

from dispatcher import Job, Registry

RECORD_DIR_ENV = "BENCH_CITUS_RECORD_DIR"

registry = Registry()
_log: IO[str] | None = None


def _write(line: str) -> None:
    global _log
    if _log is None:
        directory = os.environ[RECORD_DIR_ENV]
        # line-buffered and kept open for the process's life: one write() per line
        _log = Path(directory, f"{os.getpid()}.log").open("a", buffering=1)  # noqa: SIM115
    _log.write(line)


@registry.handler("record")
async def record(job: Job) -> None:
    start = time.time()
    _write(f"{job.id} {job.attempts} {start:.6f} -\n")
    await asyncio.sleep(0)
    _write(f"{job.id} {job.attempts} {start:.6f} {time.time():.6f}\n")
