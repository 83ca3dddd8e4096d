"""A worker's copy of the fleet's flow control (paused queues, limits), and what it makes of it.

The copy is read again at once when a claim finds it out of date (the claims carry its version:
sql/claim.sql), and every second or so (jittered) while one of the worker's queues is paused,
since it claims nothing there that could find out about a resume. `plan_for` is the pure part:
which claims a queue needs, one gated claim per limited job type (and one for the rest when a '*'
limit binds every type), and the filter that keeps the other claims off the limited types.
Semantics: docs/concepts/flow-control.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dispatcher.backoff import jittered
from dispatcher.constants import LIMIT_ANY
from dispatcher.db.rows import FlowState, Gate, Limit, TypeFilter
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.observe import metrics
from dispatcher.runtime.vitals import Vitals

log = logging.getLogger(__name__)

ANY = LIMIT_ANY


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """How to claim one flow-controlled queue: its gated claims, and whether the plain claim runs
    for the rest (`rest`: the filter that keeps it, and stealing, off the limited types)."""

    gates: tuple[Gate, ...]
    ungated: bool
    rest: TypeFilter | None


def plan_for(limits: Iterable[Limit], queue: str) -> QueuePlan | None:
    """The claims of `queue` under `limits`; None when no limit touches it (the plain claim)."""
    rows = [limit for limit in limits if limit.queue in (queue, ANY)]
    if not rows:
        return None
    typed = sorted({limit.job_type for limit in rows if limit.job_type != ANY})
    every_type = sorted((limit.job_type, limit.queue) for limit in rows if limit.job_type == ANY)
    gates = [
        Gate(
            TypeFilter((job_type,), True),
            tuple(
                sorted(
                    (limit.job_type, limit.queue)
                    for limit in rows
                    if limit.job_type in (job_type, ANY)
                )
            ),
        )
        for job_type in typed
    ]
    rest = TypeFilter(tuple(typed), False) if typed else None
    if every_type:  # a '*' limit binds the queue's other types too: they are gated as one group
        gates.append(Gate(rest, tuple(every_type)))
    return QueuePlan(tuple(gates), not every_type, rest)


class FlowControl:
    """The flow-control tables as this worker last read them (`refresh` says when they moved)."""

    REFRESH_S = 1.0

    def __init__(
        self,
        store: JobStore,
        queues: Iterable[str],
        *,
        vitals: Vitals | None = None,
    ) -> None:
        self._store = store
        self._vitals = vitals
        self._queues = tuple(queues)
        self.state = FlowState()
        # max_running_types(), kept current in place: the completer holds this very set and reads
        # it per job (their outcomes are written at once: a gated claim waits for the slot).
        self.urgent_types: set[str] = set()
        self.loaded = False
        self._plans: dict[str, QueuePlan | None] = {}
        for queue in self._queues:  # exported at 0 from the start, as counters should be
            for kind in ("max_running", "per_second"):
                metrics.FLOW_HELD_BACK.labels(queue, kind)

    @property
    def version(self) -> int:
        return self.state.version

    def paused(self, queue: str) -> bool:
        return queue in self.state.paused

    def paused_queues(self) -> tuple[str, ...]:
        """Of this worker's queues, the paused ones (for /readyz)."""
        return tuple(q for q in self._queues if q in self.state.paused)

    def max_running_types(self) -> frozenset[str]:
        """Job types under a max_running limit in one of this worker's queues ('*': any type)."""
        return frozenset(
            limit.job_type
            for limit in self.state.limits
            if limit.max_running is not None and (limit.queue == ANY or limit.queue in self._queues)
        )

    def plan(self, queue: str) -> QueuePlan | None:
        try:
            return self._plans[queue]
        except KeyError:
            plan = self._plans[queue] = plan_for(self.state.limits, queue)
            return plan

    async def refresh(self) -> bool:
        """Read the tables again (a StoreError propagates); returns whether they changed."""
        state = await self._store.flow_state()
        changed = not self.loaded or state != self.state
        if changed:
            if self.loaded and state.paused != self.state.paused:
                log.info("paused queues now: %s", ", ".join(sorted(state.paused)) or "none")
            self.state, self._plans, self.loaded = state, {}, True
            for queue in self._queues:
                metrics.QUEUE_PAUSED.labels(queue).set(1 if queue in state.paused else 0)
            if self._vitals is not None:
                self._vitals.paused_queues = self.paused_queues()
            self.urgent_types.clear()
            self.urgent_types.update(self.max_running_types())
        return changed

    async def run(self, on_change: Callable[[], None]) -> None:
        """While one of our queues is paused, re-read every REFRESH_S (jittered): nothing is claimed
        there that could find out it was resumed. Otherwise the claims' version check is enough (an
        idle worker learns of a change with its next claim), and this costs nothing. `on_change`:
        called when a re-read found them changed (the claim loop, to claim from a resumed queue)."""
        while True:
            await asyncio.sleep(jittered(self.REFRESH_S, 0.2))
            if self.paused_queues():
                with contextlib.suppress(StoreError):  # the claims report the database's state
                    if await self.refresh():
                        on_change()
