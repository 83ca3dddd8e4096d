"""Build the bucket assignments a worker's config asks for (DISPATCHER_COORDINATOR): one group per queue.

Here, not in coordinator/, because it maps dispatcher's Config onto coordinator objects and the
coordinator package imports nothing from dispatcher."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from coordinator.assignment import BucketAssignment, StaticAssignment
from dispatcher.constants import MODE_PARTITIONED, NUM_BUCKETS

if TYPE_CHECKING:
    from dispatcher.settings.config import Config


def build_assignments(config: Config, *, can_work: Callable[[], bool] = lambda: True) -> dict[str, BucketAssignment]:
    """queue -> its assignment. `can_work()` false (the worker cannot claim: its database is
    unreachable or stalled) makes a coordinated member give up its membership until it can."""
    if config.mode != MODE_PARTITIONED:
        everything = StaticAssignment(tuple(range(NUM_BUCKETS)))  # unused: SKIP LOCKED claims ignore buckets
        return dict.fromkeys(config.queues, everything)
    if config.coordinator == "static":
        static = StaticAssignment(config.static_buckets)
        return dict.fromkeys(config.queues, static)
    return {queue: _coordinated(config, queue, can_work) for queue in config.queues}


def redis_prefix(queue: str) -> str:
    """The Redis key prefix of a queue's coordination group (keys are `<prefix>:members`, ...)."""
    return f"dispatcher:{queue}"


def _coordinated(config: Config, queue: str, can_work: Callable[[], bool]) -> BucketAssignment:
    from coordinator.coordinator import Coordinator

    if config.coordinator == "redis":
        from coordinator.backend_redis import RedisBackend

        backend = RedisBackend(config.redis_url, prefix=redis_prefix(queue))  # type: ignore[arg-type]
    else:
        from coordinator.backend_pg import PostgresBackend

        # A coordination round must fail (and count towards degraded mode) well inside a membership
        # lease: a third of it, 3.3 s at the defaults.
        limits = dataclasses.replace(config.limits,
                                     statement_timeout_s=min(config.statement_s, config.coordinator_lease_s / 3))
        backend = PostgresBackend(config.dsn, group=queue,  # type: ignore[arg-type]  # validated: set
                                  session_locks=config.session_locks, limits=limits,
                                  listen_dsn=config.listen_target, listen=config.listen_target is not None)
    return Coordinator(backend, config.worker_id, lease_s=config.coordinator_lease_s,
                       poll_s=config.coordinator_poll_s, can_work=can_work, group=queue)
