"""The recording app plus handlers that misbehave, for the chaos tier's fault tests.

`registry` serves every handler of tests.apps.recording (the same functions, recording the same
way) and these, each recording its executions through `recorded` too:
- `swallow_cancel` (async): sleeps `s` seconds (payload, default 5), catching and ignoring every
  CancelledError, so neither a timeout nor a shutdown can interrupt it;
- `never_returns_sync` (sync): time.sleep(`s`), default 3600 s: a thread nothing can interrupt;
- `stuck_first_async`, `stuck_first_sync`: on a job's first attempt, deaf to cancellation (async)
  or asleep for an hour (sync): stuck past any timeout; on later attempts they return after `s`
  (default 0.2): the re-run after the stuck worker gave up;
- `raise_system_exit`, `raise_keyboard_interrupt` (async): raise those at once;
- `exit_process` (from recording): os._exit(1), the process dies mid-job.
"""

from __future__ import annotations

import asyncio
import time

from dispatcher import Job, Registry
from tests.apps import recording
from tests.apps.recording import recorded

registry = Registry()
for _job_type in recording.registry.job_types():
    _handler = recording.registry.get(_job_type)
    assert _handler is not None
    registry.handler(_job_type, timeout_s=_handler.timeout_s)(_handler.fn)


@registry.handler("swallow_cancel")
async def swallow_cancel(job: Job) -> None:
    with recorded(job):
        deadline = time.monotonic() + job.payload.get("s", 5.0)
        while (left_s := deadline - time.monotonic()) > 0:
            try:
                await asyncio.sleep(left_s)
            except asyncio.CancelledError:
                # deliberately deaf: the worker must cope with a handler that will not stop
                continue


@registry.handler("never_returns_sync")
def never_returns_sync(job: Job) -> None:
    with recorded(job):
        time.sleep(job.payload.get("s", 3600.0))


@registry.handler("stuck_first_async")
async def stuck_first_async(job: Job) -> None:
    with recorded(job):
        deadline = time.monotonic() + (3600.0 if job.attempts == 1 else job.payload.get("s", 0.2))
        while (left_s := deadline - time.monotonic()) > 0:
            try:
                await asyncio.sleep(left_s)
            except asyncio.CancelledError:
                continue  # deaf to its timeout and to the shutdown alike


@registry.handler("stuck_first_sync")
def stuck_first_sync(job: Job) -> None:
    with recorded(job):
        time.sleep(3600.0 if job.attempts == 1 else job.payload.get("s", 0.2))


@registry.handler("raise_system_exit")
async def raise_system_exit(job: Job) -> None:
    with recorded(job):
        raise SystemExit(3)


@registry.handler("raise_keyboard_interrupt")
async def raise_keyboard_interrupt(job: Job) -> None:
    with recorded(job):
        raise KeyboardInterrupt
