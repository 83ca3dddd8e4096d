"""The loop every background service of the worker runs: `PeriodicService` ticks on its store
every jittered interval (or after the delay its tick returns); a store error is counted
(dispatcher_store_errors_total) and logged, and the loop goes on until the service retires. The
maintenance services (runtime/maintenance.py, runtime/janitor.py), the table sampler, the key
sweeper and the scheduler (api/schedules/) are its subclasses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dispatcher.backoff import jittered
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.observe import metrics

log = logging.getLogger(__name__)


class PeriodicService:
    name = "maintenance"

    def __init__(
        self,
        store: JobStore,
        interval_s: float,
        *,
        first_delay_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock  # the executor's, for the lease keeper: a test passes a fake one
        self.interval_s = interval_s
        self._first_delay_s = first_delay_s
        self.retired = False  # set by a service that can never work here: run() then returns
        # The clock's time of the first of the ticks failing now (a store error); the reaper
        # reports it in the vitals. (Not the lease keeper's: its ticks catch their own errors.)
        self.tick_failing_since: float | None = None

    async def run(self) -> None:
        await asyncio.sleep(
            jittered(self.interval_s) if self._first_delay_s is None else self._first_delay_s
        )
        while True:
            try:
                next_s = await self.tick()
                self.tick_failing_since = None
            except StoreError as exc:
                metrics.STORE_ERRORS.labels(self.name).inc()
                log.warning("%s failed: %s", self.name, exc)
                next_s = None
                if self.tick_failing_since is None:
                    self.tick_failing_since = self._clock()
            self._tick_failing(self.tick_failing_since)
            if self.retired:
                return
            await asyncio.sleep(jittered(self.interval_s) if next_s is None else next_s)

    async def tick(self) -> float | None:
        """One round; returns the delay before the next one (None: the jittered interval)."""
        raise NotImplementedError

    def _tick_failing(self, since: float | None) -> None:
        """After each tick: since when ticks fail (None: the last one worked)."""
