"""Recurring jobs as the app declares them: `registry.schedule(...)`, checked when declared.

A `Schedule` is what the scheduler (scheduler.py) enqueues a job from at each of
its slots; its fingerprint tells the database's copy whether the declaration changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

import orjson

from dispatcher.api.enqueue_checks import check_names, check_options, serialize_payload
from dispatcher.api.schedules.slots import Cadence, ScheduleError
from dispatcher.constants import DEFAULT_QUEUE, is_valid_name
from dispatcher.errors import DispatcherError
from dispatcher.settings.defaults import DEFAULT_MAX_PAYLOAD_BYTES

# What a schedule does with the slots that passed while no worker could enqueue them.
CATCH_UP_LATEST: Final = "latest"  # the most recent missed slot runs once (the default)
CATCH_UP_ALL: Final = "all"  # every missed slot runs, up to CATCH_UP_ALL_MAX of the latest
CATCH_UP_NONE: Final = "none"  # missed slots are skipped: the schedule goes on from its next slot
CATCH_UP: Final = (CATCH_UP_LATEST, CATCH_UP_ALL, CATCH_UP_NONE)
# A week of an hourly schedule; a bound so that a long outage of an every-second schedule cannot
# flood the queue when the fleet comes back.
CATCH_UP_ALL_MAX: Final = 168


@dataclass(frozen=True, slots=True)
class Schedule:
    name: str
    cadence: Cadence
    job_type: str
    payload: bytes  # the job's payload, serialised once
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int | None = None  # None: the handler's, else the worker's default
    catch_up: str = CATCH_UP_LATEST

    @property
    def fingerprint(self) -> str:
        """Changes whenever the declaration does: the database's copy is then replaced."""
        fields = [
            self.cadence.text,
            self.cadence.time_zone,
            self.job_type,
            self.payload.decode(),
            self.queue,
            self.priority,
            self.max_attempts,
            self.catch_up,
        ]
        return hashlib.sha256(orjson.dumps(fields)).hexdigest()[:32]


def declare_schedule(
    name: Any,
    expression: str | None = None,
    *,
    every_s: Any = None,
    job_type: Any,
    payload: Any = None,
    queue: Any = DEFAULT_QUEUE,
    tz: Any = "UTC",
    priority: Any = 0,
    max_attempts: Any = None,
    catch_up: Any = CATCH_UP_LATEST,
) -> Schedule:
    """A checked Schedule; ScheduleError, naming the schedule, for anything wrong."""
    if not is_valid_name(name):
        raise ScheduleError(
            f"schedule name must be 1-100 letters, digits, '_', '.' or '-', got {name!r}"
        )
    try:
        cadence = Cadence.parse(expression, every_s=every_s, tz=tz)
        check_names(queue, job_type)
        check_options(priority, max_attempts, 0, 0, None)
        if catch_up not in CATCH_UP:
            raise ScheduleError(f"catch_up must be one of {', '.join(CATCH_UP)}, got {catch_up!r}")
        data = serialize_payload(payload, DEFAULT_MAX_PAYLOAD_BYTES)
    except (DispatcherError, ValueError) as exc:
        raise ScheduleError(f"schedule {name!r}: {exc}") from None
    return Schedule(name, cadence, job_type, data, queue, priority, max_attempts, catch_up)
