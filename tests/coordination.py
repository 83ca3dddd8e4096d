"""Helpers for multi-process coordination tests: backend settings per kind, a view sampler."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from coordinator.backend import ClusterView
from coordinator.errors import CoordinatorUnavailable
from dispatcher.constants import DEFAULT_QUEUE


def make_backend(kind: str, dsn: str, redis_url: str | None) -> Any:
    if kind == "redis":
        from coordinator.backend_redis import RedisBackend
        from dispatcher.serve.coordination import redis_prefix

        return RedisBackend(redis_url, prefix=redis_prefix(DEFAULT_QUEUE))  # type: ignore[arg-type]
    from coordinator.backend_pg import PostgresBackend

    return PostgresBackend(dsn, session_locks=kind != "postgres_leases_only")


class ViewSampler:
    """Reads the cluster view every `interval_s` in a thread of its own (its own event loop and
    backend connection), keeping every sample: the tests' eyes on the assignment over time."""

    def __init__(self, factory: Callable[[], Any], interval_s: float = 0.02) -> None:
        self._factory = factory
        self._interval_s = interval_s
        self.samples: list[tuple[float, ClusterView]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ViewSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        backend = self._factory()
        try:
            await backend.connect()
            while not self._stop.is_set():
                try:
                    self.samples.append((time.monotonic(), await backend.view()))
                except CoordinatorUnavailable:
                    self.errors += 1
                await asyncio.sleep(self._interval_s)
        finally:
            with contextlib.suppress(Exception):
                await backend.close()

    @property
    def latest(self) -> ClusterView | None:
        return self.samples[-1][1] if self.samples else None

    def settled(self, members: set[str]) -> dict[int, str] | None:
        """The assignment if the view shows exactly `members`, all 64 buckets owned by them,
        balanced, no hand-off pending; else None."""
        view = self.latest
        if view is None or set(view.members) != members:
            return None
        owners = {s.bucket: s.owner for s in view.buckets}
        if any(s.next_owner is not None for s in view.buckets) or set(owners.values()) != members:
            return None
        counts = [list(owners.values()).count(m) for m in members]
        return owners if max(counts) - min(counts) <= 1 else None  # type: ignore[return-value]

    def owners_per_epoch(self) -> dict[tuple[int, int], set[str]]:
        seen: dict[tuple[int, int], set[str]] = defaultdict(set)
        for _, view in self.samples:
            for s in view.buckets:
                if s.owner is not None:
                    seen[(s.bucket, s.epoch)].add(s.owner)
        return seen

    def first_seen(self, member: str) -> float | None:
        return next((t for t, v in self.samples if member in v.members), None)
