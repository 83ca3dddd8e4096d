"""The worker's vitals: one object the services write and the producer, the coordinators and the
health probes read, so none of them reaches into another or into the worker.

Plain attributes only (floats of time.monotonic(), bools, a tuple): the HTTP server's thread reads
them while the event loop writes them, and a stalled loop must not stop a probe from answering.

- `claims_failing_since`: the producer's claims fail (database unreachable or stalled);
- `heartbeats_failing_since`: the lease keeper's heartbeats fail: `stalled`, so claim nothing;
- `reaper_failing_since`: the reaper's ticks fail (every pod, every few seconds, maintenance link);
- `started`, `stopping`, `gave_up` (on stuck handlers): the worker's phase; `assignments`: what
  decides its buckets, per queue;
- `paused_queues`: its queues that an operator paused (flow_control.py); not a readiness check.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Vitals:
    claims_failing_since: float | None = None
    heartbeats_failing_since: float | None = None
    reaper_failing_since: float | None = None
    started: bool = False  # every service is up and the coordination groups are joined
    stopping: bool = False  # stop() was called: draining
    gave_up: bool = False  # stuck handlers: it stopped claiming and exits (runtime/stuck.py)
    coordinated: bool = False  # a coordinator assigns the buckets: its state is a readiness check
    # The distinct assignments (one per queue's group); each coordinated one has a `state`.
    assignments: tuple[object, ...] = ()
    # of its queues, those paused (dispatcher queues pause): a detail
    paused_queues: tuple[str, ...] = ()

    @property
    def stalled(self) -> bool:
        """Heartbeats fail: jobs claimed now would have leases we cannot extend."""
        return self.heartbeats_failing_since is not None

    @property
    def failing_since(self) -> float | None:
        """Since when the worker cannot work (its claims or heartbeats fail); None while it can.
        What a coordinator reads to give its membership up (coordinator.Liveness)."""
        failing = [
            t for t in (self.claims_failing_since, self.heartbeats_failing_since) if t is not None
        ]
        return min(failing) if failing else None

    @property
    def database_failing(self) -> bool:
        """Any of the worker's own statements fails now: claims, heartbeats or the reaper's."""
        return self.failing_since is not None or self.reaper_failing_since is not None
