"""Chained claims (partitioned mode): a keyed completion claims its keys' next jobs for this worker.

When a job with an ordering key completes, its key's next job is the one this worker would claim
next anyway: it owns the bucket the key maps to. So the completion statement claims it at once
(ordering_chain_next), into slots reserved before the statement is sent, instead of queueing it
and waking this worker to claim it with a statement of its own. SKIP LOCKED mode has no owner
and does not chain; a queue whose assignment is degraded (owned() is None) does not either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from coordinator.assignment import BucketAssignment
from dispatcher.db.rows import Chain
from dispatcher.model import Job
from dispatcher.observe import metrics
from dispatcher.runtime.executor import Executor


class Chaining:
    def __init__(
        self,
        executor: Callable[[], Executor],
        assignments: Mapping[str, BucketAssignment],
        concurrency: int,
        lease_s: float,
        mode: str,
        claiming: Callable[[], bool],
    ) -> None:
        # A callable: the executor is built on the completer, which is built with this chaining.
        self._executor = executor
        self._assignments = assignments
        self._concurrency = concurrency
        self._lease_s = lease_s
        self._mode = mode
        self._claiming = claiming  # False once shutdown began: nothing new may start
        self.chained = 0

    def reserve(self) -> Chain:
        """The chain a completion may claim now: our owned buckets, and our free slots, which are
        held (counted in flight) until settle() so the producer does not fill them meanwhile."""
        executor = self._executor()
        free = self._concurrency - executor.in_flight
        if free <= 0 or not self._claiming():
            return Chain(lease_s=self._lease_s)
        queues: list[str] = []
        buckets: list[int] = []
        for queue, assignment in self._assignments.items():
            owned = assignment.owned()
            if owned:
                queues += [queue] * len(owned)
                buckets += owned
        if not buckets:
            return Chain(lease_s=self._lease_s)
        executor.in_flight += free
        return Chain(tuple(queues), tuple(buckets), free, self._lease_s)

    def settle(self, chain: Chain, jobs: list[Job], sent_at: float) -> None:
        """Give back the reserved slots and start what the completion claimed (its leases run from
        `sent_at`, when the statement was sent: time.monotonic())."""
        executor = self._executor()
        executor.in_flight -= chain.limit
        if jobs:
            self.chained += len(jobs)
            for job in jobs:
                metrics.JOBS_CLAIMED.labels(job.queue, self._mode).inc()
            executor.start(jobs, sent_at)
        if chain.limit > len(jobs):
            executor.slot_freed.set()
