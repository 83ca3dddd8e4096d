"""What /livez and /readyz answer, judged in the HTTP server's thread from plain attributes the
event loop writes: never a database statement, never an asyncio call, so the answers come even
while the loop is stalled. What each check means: docs/operations/health-and-metrics.md.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric

from dispatcher.runtime.vitals import Vitals

LOOP_TICK_S = 1.0
# Worst first: the state of a worker with several queues is its worst queue's.
_ASSIGNMENT_ORDER = ("stopped", "resigned", "joining", "degraded", "member")
_READY_ASSIGNMENTS = frozenset({"owned", "degraded", "not used"})


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    checks: dict[str, str]

    def body(self) -> dict[str, Any]:
        return {"status": "ready" if self.ready else "not ready", "checks": self.checks}


def judge(*, worker: str, database: str, schema: str, assignment: str) -> Readiness:
    """The readiness rule (module docstring), on the checks' states."""
    ready = (
        worker == "running"
        and database == "ok"
        and schema == "current"
        and assignment in _READY_ASSIGNMENTS
    )
    return Readiness(
        ready, {"worker": worker, "database": database, "schema": schema, "assignment": assignment}
    )


def assignment_state(coordinated: bool, states: list[str]) -> str:
    """The assignment check from the coordinators' states (one per queue; Coordinator.state);
    not used in SKIP LOCKED mode or with the static coordinator (`coordinated` false)."""
    if not coordinated:
        return "not used"
    if not states:
        return "not started"
    worst = min(states, key=lambda s: _ASSIGNMENT_ORDER.index(s) if s in _ASSIGNMENT_ORDER else -1)
    return "owned" if worst == "member" else worst


@dataclass(slots=True)
class StartupState:
    """What startup.wait_until_ready last learnt (written on the loop, read by probes)."""

    database: str = "unknown"  # unknown, unreachable, ok
    schema: str = "unknown"  # unknown, missing, older, unreadable, current

    def update(self, database: str, schema: str) -> None:
        self.database, self.schema = database, schema


@dataclass(slots=True, weakref_slot=True, eq=False)  # eq=False: hashable, for the WeakSet
class Health:
    loop_stall_s: float
    startup: StartupState = field(default_factory=StartupState)
    vitals: Vitals = field(default_factory=Vitals)  # the worker's, written by its services
    _beat: float | None = None  # time.monotonic() of the loop's last tick

    def __post_init__(self) -> None:
        COLLECTOR.track(self)

    # -- written on the event loop -----------------------------------------------------------------

    async def beat_forever(self) -> None:
        """The loop heartbeat (module docstring); cancelled when the loop's work ends."""
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(LOOP_TICK_S)

    # -- read from any thread ----------------------------------------------------------------------

    def loop_age_s(self) -> float | None:
        beat = self._beat
        return None if beat is None else max(0.0, time.monotonic() - beat)

    def livez(self) -> tuple[int, dict[str, Any]]:
        age = self.loop_age_s()
        if age is not None and age > self.loop_stall_s:
            return 503, {
                "status": "stalled",
                "loop_heartbeat_age_s": round(age, 3),
                "loop_stall_s": self.loop_stall_s,
            }
        return 200, {"status": "ok", "loop_heartbeat_age_s": None if age is None else round(age, 3)}

    def readiness(self) -> Readiness:
        vitals = self.vitals
        age = self.loop_age_s()
        started = vitals.started
        if vitals.gave_up:
            phase = "stuck"  # stuck handlers: it stopped claiming and exits (runtime/stuck.py)
        elif vitals.stopping:
            phase = "stopping"
        elif age is not None and age > self.loop_stall_s:
            phase = "stalled"
        else:
            phase = "running" if started else "starting"
        database, schema = self.startup.database, self.startup.schema
        assignment = "not started"
        if started:
            database = "failing" if vitals.database_failing else "ok"
            states = [getattr(a, "state", "member") for a in vitals.assignments]
            assignment = assignment_state(vitals.coordinated, states)
        return judge(worker=phase, database=database, schema=schema, assignment=assignment)

    def readyz(self) -> tuple[int, dict[str, Any]]:
        readiness = self.readiness()
        body = readiness.body()
        # A detail, not a check: a paused queue is an operator's choice, and the pod is healthy.
        body["paused_queues"] = list(self.vitals.paused_queues)
        return (200 if readiness.ready else 503), body


class HealthCollector:
    """`dispatcher_ready` and `dispatcher_loop_heartbeat_age_seconds`, computed at scrape time."""

    def __init__(self) -> None:
        self._health: weakref.WeakSet[Health] = weakref.WeakSet()

    def track(self, health: Health) -> None:
        self._health.add(health)

    def describe(self) -> Iterator[Metric]:
        return iter(self._families([]))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(list(self._health)))

    @staticmethod
    def _families(healths: list[Health]) -> list[Metric]:
        ready = GaugeMetricFamily(
            "dispatcher_ready", "1 while /readyz answers 200 (the worker does its share)"
        )
        age = GaugeMetricFamily(
            "dispatcher_loop_heartbeat_age_seconds",
            "Seconds since the event loop last ticked (it ticks every second; /livez fails "
            "past loop_stall_s)",
        )
        if healths:
            ready.add_metric([], min(1 if h.readiness().ready else 0 for h in healths))
            ages = [a for h in healths if (a := h.loop_age_s()) is not None]
            if ages:
                age.add_metric([], max(ages))
        return [ready, age]


COLLECTOR = HealthCollector()
REGISTRY.register(COLLECTOR)
