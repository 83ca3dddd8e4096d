"""Handlers that ignore their timeout: the watch that finds them and decides when the worker exits.

A job is stuck once its handler still runs `stuck_grace_s` after its timeout fired (an async one
that swallows its cancellation, a sync one whose thread never returns). It is logged once, counted,
and keeps its slot and its lease. Once stuck jobs hold over half the slots (or of the sync
threads), or one has been stuck `stuck_exit_after_s`, the worker gives up: it stops claiming and
exits, and the handlers die with the process (docs/operations/running-workers.md#stuck-handlers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dispatcher.model import Job
from dispatcher.observe import metrics
from dispatcher.runtime.held_jobs import Running
from dispatcher.settings.sections import ExecutionSettings

log = logging.getLogger(__name__)

# How often the watch looks: the rule counts in tens of seconds; a second late is nothing.
CHECK_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class StuckJob:
    job: Job
    stuck_since: float  # the clock's time: its timeout plus the grace
    sync: bool  # a thread (nothing can stop it), else an async handler that ignores cancellation


def stuck_jobs(held: Iterable[Running], now: float, grace_s: float) -> list[StuckJob]:
    """The jobs of `held` (handlers running now) still running `grace_s` after their timeout
    fired."""
    return [
        StuckJob(r.job, r.timeout_at + grace_s, r.task is None)
        for r in held
        if r.timeout_at is not None and now >= r.timeout_at + grace_s
    ]


def give_up_reason(
    stuck: list[StuckJob], now: float, concurrency: int, exit_after_s: float, sync_threads: int
) -> str | None:
    """Why the worker must exit now because of `stuck`, or None: stuck jobs hold over half of its
    `concurrency` slots, or over half of its `sync_threads` (sync jobs would wait behind them,
    claimed and unstarted), or one has been stuck `exit_after_s` (0: that rule is off)."""
    if not stuck:
        return None
    if 2 * len(stuck) > concurrency:
        return f"stuck handlers hold {len(stuck)} of its {concurrency} slots (over half)"
    threads = sum(s.sync for s in stuck)
    if 2 * threads > sync_threads:
        return f"stuck handlers hold {threads} of its {sync_threads} sync threads (over half)"
    oldest = min(stuck, key=lambda s: s.stuck_since)
    if exit_after_s > 0 and now - oldest.stuck_since >= exit_after_s:
        return (
            f"job {oldest.job.id} ({oldest.job.job_type}) has been stuck for "
            f"{now - oldest.stuck_since:.0f} s (stuck_exit_after_s {exit_after_s:g})"
        )
    return None


class StuckWatch:
    """Looks at the executor's running handlers every CHECK_INTERVAL_S (see the module docstring);
    calls `on_give_up(reason)` once when the rule says the worker must exit."""

    name = "stuck watch"

    def __init__(
        self,
        held: Callable[[], list[Running]],
        execution: ExecutionSettings,
        concurrency: int,
        *,
        on_give_up: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._held = held
        self._grace_s = execution.stuck_grace_s
        self._exit_after_s = execution.stuck_exit_after_s
        self._concurrency = concurrency
        self._sync_threads = execution.sync_threads
        self._on_give_up = on_give_up
        self._clock = clock  # the executor's: timeout_at is on it
        # stuck jobs already logged (each once, while it stays stuck)
        self._logged: set[int] = set()
        self.stuck: list[StuckJob] = []
        self.gave_up: str | None = None  # the reason, once given up

    def check(self) -> list[StuckJob]:
        """One look: log the newly stuck, update the gauge, give up if the rule says so."""
        now = self._clock()
        self.stuck = stuck = stuck_jobs(self._held(), now, self._grace_s)
        ids = {s.job.id for s in stuck}
        for s in stuck:
            if s.job.id not in self._logged:
                metrics.STUCK_JOBS_FOUND.inc()
                how = (
                    "its thread has not returned (a thread cannot be stopped)"
                    if s.sync
                    else "it ignored its cancellation"
                )
                log.error(
                    "job %d (%s) is stuck: its handler still runs %g s after its timeout fired; "
                    "%s. Its slot stays taken and its lease is kept while this process lives",
                    s.job.id,
                    s.job.job_type,
                    self._grace_s,
                    how,
                    extra={
                        "job_id": s.job.id,
                        "job_type": s.job.job_type,
                        "stuck_jobs": len(stuck),
                    },
                )
        self._logged = ids
        metrics.STUCK_JOBS.set(len(stuck))
        reason = give_up_reason(
            stuck, now, self._concurrency, self._exit_after_s, self._sync_threads
        )
        if reason is not None and self.gave_up is None:
            self.gave_up = reason
            self._on_give_up(reason)
        return stuck

    def count_now(self) -> int:
        """How many jobs are stuck now (nothing logged or decided): what a shutdown need not wait
        for."""
        return len(stuck_jobs(self._held(), self._clock(), self._grace_s))

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(CHECK_INTERVAL_S)
                self.check()
        finally:
            metrics.STUCK_JOBS.set(0)
