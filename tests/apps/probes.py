"""A worker app for the health and metrics tests (tests/integration/test_health_http.py).

- `flaky` (async): sleeps `s` seconds (payload, default 0.02), then raises on its first
  `fail_attempts` attempts (payload, default 0) and returns on the next: a retried attempt;
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
async def flaky(job: Job) -> None:
    await asyncio.sleep(job.payload.get("s", 0.02))
    if job.attempts <= job.payload.get("fail_attempts", 0):
        raise RuntimeError(f"flaky: attempt {job.attempts} fails on purpose")


@registry.handler("block_loop")
async def block_loop(job: Job) -> None:
    time.sleep(job.payload["s"])  # noqa: ASYNC251 - blocking the loop is the point


@registry.handler("hold")
async def hold(job: Job) -> None:
    await asyncio.sleep(job.payload.get("s", 3600.0))
