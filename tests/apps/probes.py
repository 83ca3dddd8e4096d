"""A worker app for the health and metrics tests (tests/integration/test_health_http.py).

- `flaky` (sync): sleeps `s` seconds (payload, default 0.03) in its thread, then raises on its
  first `fail_attempts` attempts (payload, default 0) and returns on the next: a retried attempt.
  Sync so that its run time is at least `s` by the monotonic clock (an async sleep is timed by
  the loop's cached clock, which lags on a busy machine: it may end sooner);
- `block_loop` (async): time.sleep(`s`) inside `async def`, the bug /livez exists for: the
  event loop is blocked for `s` seconds;
- `hold` (async): asyncio.sleep(`s`), default 3600: a job that runs until the worker stops.
"""

from __future__ import annotations

import asyncio
import time

from dispatcher import Job, Registry

registry = Registry()


@registry.handler("flaky")
def flaky(job: Job) -> None:
    time.sleep(job.payload.get("s", 0.03))
    if job.attempts <= job.payload.get("fail_attempts", 0):
        raise RuntimeError(f"flaky: attempt {job.attempts} fails on purpose")


@registry.handler("block_loop")
async def block_loop(job: Job) -> None:
    time.sleep(job.payload["s"])


@registry.handler("hold")
async def hold(job: Job) -> None:
    await asyncio.sleep(job.payload.get("s", 3600.0))
