"""A worker app whose jobs fail, for the log tests (tests/integration/test_logs.py).

- `fail` (async): raises ValueError("boom <id>") with a second line, on every attempt;
- `fail_sync` (sync): the same from a thread of the pool;
- `hang` (async, timeout_s=0.3): sleeps past its time limit;
- `permanent` (async): raises PermanentJobError;
- `slow` (async): sleeps 60 s, keeping a shutdown busy;
- `chatty` (async): logs the payload's `dsn` through the app's own logger (a third-party logger
  to the dispatcher), from the event loop and from a thread, then succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from dispatcher import Job, PermanentJobError, Registry

registry = Registry()
log = logging.getLogger("tests.apps.failing")


@registry.handler("fail")
async def fail(job: Job) -> None:
    raise ValueError(f"boom {job.id}\nsecond line of the message")


@registry.handler("fail_sync")
def fail_sync(job: Job) -> None:
    raise ValueError(f"boom {job.id} (sync)")


@registry.handler("hang", timeout_s=0.3)
async def hang(job: Job) -> None:
    await asyncio.sleep(30)


@registry.handler("slow")
async def slow(job: Job) -> None:
    await asyncio.sleep(60)


@registry.handler("permanent")
async def permanent(job: Job) -> None:
    raise PermanentJobError(f"no such customer for job {job.id}")


@registry.handler("chatty")
async def chatty(job: Job) -> None:
    log.warning("connecting to %s", job.payload["dsn"])
    thread = threading.Thread(target=log.warning, args=("from a thread: %s", job.payload["dsn"]))
    thread.start()
    await asyncio.to_thread(thread.join)
