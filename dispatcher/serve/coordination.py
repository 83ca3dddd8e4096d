"""Build the bucket assignments a worker's config asks for (DISPATCHER_COORDINATOR): one group
per queue.

Here, not in coordinator/, because it maps dispatcher's Config onto coordinator objects and the
coordinator package imports nothing from dispatcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.assignment import BucketAssignment, StaticAssignment
from dispatcher.constants import NUM_BUCKETS
from dispatcher.settings.sections import CoordinationSettings

if TYPE_CHECKING:
    from coordinator.coordinator import Liveness


def build_assignments(
    settings: CoordinationSettings, *, liveness: Liveness | None = None
) -> dict[str, BucketAssignment]:
    """queue -> its assignment. While the worker cannot work (`liveness.failing_since`: its claims
    or heartbeats fail), a coordinated member gives up its membership until it can."""
    if not settings.partitioned:
        # unused: SKIP LOCKED claims ignore buckets
        everything = StaticAssignment(tuple(range(NUM_BUCKETS)))
        return dict.fromkeys(settings.queues, everything)
    if settings.coordinator == "static":
        static = StaticAssignment(settings.static_buckets)
        return dict.fromkeys(settings.queues, static)
    return {queue: _coordinated(settings, queue, liveness) for queue in settings.queues}


def redis_prefix(queue: str, key_prefix: str = "dispatcher") -> str:
    """The Redis key prefix of a queue's coordination group, `<key_prefix>:<queue>` (keys are
    `<prefix>:members`, ...). key_prefix is DISPATCHER_REDIS_KEY_PREFIX: deployments that share
    one Redis database keep apart by it. Queue names have no `:`, so one prefix's groups never
    overlap."""
    return f"{key_prefix}:{queue}"


def _coordinated(
    settings: CoordinationSettings, queue: str, liveness: Liveness | None
) -> BucketAssignment:
    from coordinator.backend import CoordinatorBackend
    from coordinator.coordinator import Coordinator

    backend: CoordinatorBackend
    if settings.coordinator == "redis":
        from coordinator.backend_redis import RedisBackend

        backend = RedisBackend(
            settings.redis_url,  # type: ignore[arg-type]  # validated: set in redis mode
            prefix=redis_prefix(queue, settings.redis_key_prefix),
        )
    else:
        from coordinator.backend_pg import PostgresBackend

        # settings.limits: a coordination round fails (and counts towards degraded mode) well
        # inside a membership lease, a third of it (3.3 s at the defaults).
        backend = PostgresBackend(
            settings.dsn,  # type: ignore[arg-type]  # validated: set in postgres mode
            group=queue,
            session_locks=settings.session_locks,
            limits=settings.limits,
            listen_dsn=settings.listen_dsn,
            listen=settings.listen_dsn is not None,
        )
    return Coordinator(
        backend,
        settings.member,
        lease_s=settings.lease_s,
        poll_s=settings.poll_s,
        liveness=liveness,
        group=queue,
    )
