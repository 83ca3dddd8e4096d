"""The worker's row in the worker registry (dispatcher_workers, migration 0016), whatever its mode
and coordinator: a heartbeat every INTERVAL_S (jittered) saying who it is, what it serves and how
busy it is, live for LEASE_INTERVALS of them; and a stop that takes it out of the live view at once.

Each beat also reads the rows of the workers seen lately, for two decisions no single worker can
make alone: whether anybody has served a job type lately (the executor hands a job of a type it
has no handler for back until then, and discards it after `unserved_type_discard_s` unserved), and
whether a younger live worker declares other schedules for a queue (the scheduler then leaves that
queue's lease to it: the schedules of the newest release run during a rollout).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from dispatcher._version import __version__
from dispatcher.api.schedules.declarations import Schedule
from dispatcher.db import rows
from dispatcher.db.periodic import PeriodicService
from dispatcher.db.queries import query
from dispatcher.db.store import JobStore

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
LEASE_INTERVALS = 3  # a killed worker leaves the live view this many intervals after its last beat
PRUNE_EVERY = 30  # beats between two prunes of rows no longer telling anything
LEAVE_TIMEOUT_S = 2.0  # the stop's write, at most (shutdown is bounded)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a worker says of itself in the registry (the parts that do not change while it runs)."""

    worker_id: str
    mode: str
    coordinator: str
    queues: tuple[str, ...]
    job_types: tuple[str, ...]
    concurrency: int
    # {queue: {schedule name: fingerprint}}
    schedules: Mapping[str, Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class SeenWorker:
    """A worker seen lately (presence_lately)."""

    worker_id: str
    started_at: datetime
    queues: list[str]
    job_types: list[str]
    schedules: dict[str, dict[str, str]]
    live: bool


def declared_schedules(
    schedules: Sequence[Schedule], queues: Sequence[str]
) -> dict[str, dict[str, str]]:
    """{queue: {name: fingerprint}} of a registry's schedules, for the queues a worker serves (it
    enqueues only those)."""
    by_queue: dict[str, dict[str, str]] = {queue: {} for queue in queues}
    for s in schedules:
        if s.queue in by_queue:
            by_queue[s.queue][s.name] = s.fingerprint
    return by_queue


class Presence(PeriodicService):
    name = "presence"

    def __init__(
        self,
        store: JobStore,
        identity: Identity,
        running: Callable[[], int],
        *,
        unserved_window_s: float,
        interval_s: float = INTERVAL_S,
    ) -> None:
        super().__init__(store, interval_s, first_delay_s=0.0)  # seen from the start
        self.identity = identity
        self._running = running
        self.unserved_window_s = unserved_window_s
        self.started_at: datetime | None = None  # by the database clock, from the first beat
        self._seen: list[SeenWorker] | None = None  # None until the first beat read them
        self._beats = 0

    async def tick(self) -> float | None:
        ident = self.identity
        params: dict[str, Any] = {
            "worker_id": ident.worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "mode": ident.mode,
            "coordinator": ident.coordinator,
            "queues": list(ident.queues),
            "job_types": list(ident.job_types),
            "schedules": Jsonb(ident.schedules),
            "concurrency": ident.concurrency,
            "running": self._running(),
            "lease_s": LEASE_INTERVALS * self.interval_s,
            "window_s": self.unserved_window_s,
            "first": self.started_at is None,
        }
        prune = self._beats % PRUNE_EVERY == 0
        self._beats += 1

        async def work(conn: psycopg.AsyncConnection[Any]) -> list[SeenWorker]:
            cur = await conn.execute(query("presence_beat"), params)
            self.started_at = rows.value(await cur.fetchone())
            if prune:
                await conn.execute(query("presence_prune"), params)
            cur = await conn.execute(query("presence_lately"), params)
            return rows.typed(SeenWorker, await cur.fetchall())

        self._seen = await self._store.run("presence", work)
        return None

    def served_lately(self, job_type: str) -> bool | None:
        """Whether some worker (this one aside) served `job_type` within the unserved window;
        None before the first beat read the registry (then nobody may conclude it is unserved)."""
        if self._seen is None:
            return None
        me = self.identity.worker_id
        return any(job_type in w.job_types for w in self._seen if w.worker_id != me)

    def defers_schedules(self, queue: str) -> bool:
        """A live worker that started after this one declares other schedules for `queue`: a
        newer release. Its declarations win, so this worker leaves the queue's lease to it."""
        return bool(self._differing(queue, newer=True))

    def yielding_schedules(self, queue: str) -> list[str]:
        """The live workers that started before this one and declare other schedules for
        `queue`: they defer to this one, which may take the queue's lease from them at once."""
        return self._differing(queue, newer=False)

    def _differing(self, queue: str, *, newer: bool) -> list[str]:
        if self._seen is None or self.started_at is None:
            return []
        mine = dict(self.identity.schedules.get(queue, {}))
        return [
            w.worker_id
            for w in self._seen
            if w.worker_id != self.identity.worker_id
            and w.live
            and (w.started_at > self.started_at) == newer
            and w.started_at != self.started_at
            and queue in w.queues
            and w.schedules.get(queue, {}) != mine
        ]

    async def release(self) -> None:
        """At shutdown, with the roles: leave the live view."""
        await self.leave()

    async def leave(self) -> None:
        """Out of the live view at once (a clean stop); bounded, and never raises: a worker that
        cannot say it left drops out when its lease runs out."""

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("presence_leave"), {"worker_id": self.identity.worker_id})

        try:
            await asyncio.wait_for(self._store.run("presence", work), LEAVE_TIMEOUT_S)
        except Exception as exc:  # a stop goes on whatever the database says
            log.info("could not take this worker out of the registry (%s): its lease ends it", exc)
