"""Handlers the demo and the benchmarks run: `dispatcher run --app
dispatcher.devtools.demo_app:registry`."""

from __future__ import annotations

import asyncio
import random

from dispatcher.api.registry import Registry
from dispatcher.model import Job

registry = Registry()


@registry.handler("noop")
async def noop(job: Job) -> None:
    """Does nothing: measures the queue itself."""


@registry.handler("sleep")
async def sleep(job: Job) -> None:
    """Waits payload['ms'] milliseconds (default 10): an I/O-bound job."""
    await asyncio.sleep(job.payload.get("ms", 10) / 1000)


@registry.handler("flaky")
async def flaky(job: Job) -> None:
    """Fails with probability payload['p'] (default 0.3): exercises retries."""
    if random.random() < job.payload.get("p", 0.3):
        raise RuntimeError(f"flaky job {job.id} failed on attempt {job.attempts}")
