"""The worker app of `python -m bench keyed`: the no-op handler, recording when each job ran.

Each worker process keeps (job id, ordering key, start, end) per job in a list, the times from
CLOCK_MONOTONIC (time.monotonic_ns: one clock for every process of the machine), and writes it
to BENCH_KEYED_RECORD_DIR/<pid>.tsv when the process exits, after the measured window. Between
start and end the handler yields to the event loop once: two jobs of one key that a broken rule
let one worker run together would interleave there and overlap in the recording (a handler
that never yields runs start to end in one go and could hide it). That costs every job of every
mix, the keyless baseline included, one pass of the loop. bench/keyed.py checks the order.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from pathlib import Path

from dispatcher import Job, Registry

RECORD_DIR_ENV = "BENCH_KEYED_RECORD_DIR"
NO_KEY = "\\N"  # the recording's spelling of a job without a key

registry = Registry()
_runs: list[tuple[int, str | None, int, int]] = []


@registry.handler("noop")
async def noop(job: Job) -> None:
    """Does nothing but yield once; records its start and end."""
    start = time.monotonic_ns()
    await asyncio.sleep(0)
    _runs.append((job.id, job.ordering_key, start, time.monotonic_ns()))


def _dump(directory: str) -> None:
    lines = "".join(f"{i}\t{NO_KEY if k is None else k}\t{s}\t{e}\n" for i, k, s, e in _runs)
    Path(directory, f"{os.getpid()}.tsv").write_text(lines)


if os.environ.get(RECORD_DIR_ENV):
    atexit.register(_dump, os.environ[RECORD_DIR_ENV])
