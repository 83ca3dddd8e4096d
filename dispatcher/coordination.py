"""Build the bucket assignment a worker's config asks for (DISPATCHER_COORDINATOR).

Here, not in coordinator/: it maps dispatcher's Config onto coordinator objects, and the
coordinator package imports nothing from dispatcher."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from coordinator.assignment import BucketAssignment, StaticAssignment

from .constants import MODE_PARTITIONED, NUM_BUCKETS

if TYPE_CHECKING:
    from .config import Config


def build_assignment(config: Config) -> BucketAssignment:
    if config.mode != MODE_PARTITIONED:
        return StaticAssignment(tuple(range(NUM_BUCKETS)))  # unused: SKIP LOCKED claims ignore buckets
    if config.coordinator == "static":
        return StaticAssignment(config.static_buckets)
    from coordinator.coordinator import Coordinator

    if config.coordinator == "redis":
        from coordinator.backend_redis import RedisBackend

        backend = RedisBackend(config.redis_url)  # type: ignore[arg-type]  # validated: set for redis
    else:
        from coordinator.backend_pg import PostgresBackend

        # A coordination round must fail (and count towards degraded mode) well inside a membership
        # lease: a third of it, 3.3 s at the defaults.
        limits = dataclasses.replace(config.limits,
                                     statement_timeout_s=min(config.statement_s, config.coordinator_lease_s / 3))
        backend = PostgresBackend(config.dsn, session_locks=config.session_locks,  # type: ignore[arg-type]
                                  limits=limits)
    return Coordinator(backend, config.worker_id, lease_s=config.coordinator_lease_s, poll_s=config.coordinator_poll_s)
