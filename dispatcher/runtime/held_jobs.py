"""What the executor keeps of each job it holds: its state, its lease as we last extended it,
its task or thread, and the counts of jobs whose lease was lost (dispatcher/runtime/executor.py).

Kept apart from the executor so that the executor reads as the job's lifecycle."""

from __future__ import annotations

import asyncio
import enum
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from dispatcher.model import Job

EAGER_TASKS = sys.version_info >= (3, 12)


def new_task(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]
) -> asyncio.Task[None]:
    if EAGER_TASKS:
        # eager_start is Python 3.12's (EAGER_TASKS); the type check targets 3.11
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    return loop.create_task(coro)


# What became of a job whose lease we lost (the metric's label -> the log's words).
# Why a lease was lost (dispatcher_leases_lost_total{reason}): a heartbeat found the job taken
# over, or it ran out by the executor's own timer while heartbeats did not reach the database.
TAKEN_OVER, RAN_OUT = "taken_over", "ran_out"
LOST_ACTIONS = {
    "dropped_unstarted": "dropped before they started",
    "cancelled": "cancelled (async)",
    "left_running_sync": "left to finish in their threads, outcomes not written",
}


class State(enum.Enum):
    BACKLOG = "backlog"  # a sync job waiting for a thread: claimed, not started
    RUNNING = "running"
    LOST = "lost"  # its lease is gone: no outcome will be written, no heartbeat sent
    ABANDONED = "abandoned"  # shutdown gave up waiting for it; the lease brings it back


@dataclass(slots=True)
class Running:
    job: Job
    # the executor's clock when its claim was sent: its lease runs from (at the latest) then
    held_since: float
    # our conservative estimate of the lease's end, on the executor's clock (time.monotonic)
    lease_until: float
    task: asyncio.Task[None] | None = None  # None: a sync handler (backlogged or in a thread)
    timer: asyncio.TimerHandle | None = None
    state: State = State.RUNNING
    cancelling: bool = False  # an operator asked to cancel it: it ends 'cancelled' however it ends
    # the clock's time its timeout fires (None: none, or not started yet)
    timeout_at: float | None = None


def running_by_queue(entries: list[Running], starting: Job | None) -> dict[str, int]:
    """Jobs whose handler runs now, by queue: `entries` but the backlog (not started), and
    `starting`, the one running inside its eager start (not among them yet)."""
    counts: dict[str, int] = {starting.queue: 1} if starting is not None else {}
    for entry in entries:
        if entry.state is not State.BACKLOG and entry.job is not starting:
            counts[entry.job.queue] = counts.get(entry.job.queue, 0) + 1
    return counts


@dataclass(slots=True)
class ExecutorStats:
    timeouts: int = 0
    lost_dropped: int = 0  # lease lost before the job started: never started here
    lost_cancelled: int = 0  # lease lost while an async handler ran: cancelled, no outcome
    lost_running: int = 0  # lease lost while a sync handler ran: it finishes, its outcome is fenced
    # leases lost, by why: a heartbeat found them taken over; they ran out by our own timer
    leases_taken_over: int = 0
    leases_ran_out: int = 0
