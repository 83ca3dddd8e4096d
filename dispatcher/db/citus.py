"""`dispatcher migrate --citus`: the schema placed over a Citus cluster, buckets as shards.

The jobs table is hash-distributed by `bucket` and split until each of the 64 buckets has a shard
of its own, spread round-robin over the nodes; the archive of completed jobs is distributed the
same way, colocated with it; the flow-control tables a claim reads become reference tables;
everything else stays on the coordinator node. So every statement a worker runs
for one bucket is a router query on one node. Idempotent, and in place: a table that holds jobs
keeps them, and workers' writes wait while its rows are copied. Why: docs/concepts/citus.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from dispatcher.constants import NUM_BUCKETS
from dispatcher.db import rows
from dispatcher.db.migrate import connect_migrator
from dispatcher.db.queries import query
from dispatcher.db.translate import store_error
from dispatcher.errors import MigrationError

log = logging.getLogger(__name__)


def citus_version(conn: psycopg.Connection[Any]) -> str | None:
    """The citus extension's version in this database, or None without it."""
    version = rows.value(conn.execute(query("citus_version")).fetchone())
    return None if version is None else str(version)


def hash_distributed(placement: Sequence[Any] | None) -> bool:
    """Whether citus_distribution's row (None: no row) says the jobs table is hash-distributed."""
    return placement is not None and placement[0] == "h"


def jobs_distributed(conn: psycopg.Connection[Any] | None, version: str | None) -> bool:
    """Whether the jobs table is hash-distributed (needs `version` from citus_version)."""
    if conn is None or version is None:
        return False
    return hash_distributed(conn.execute(query("citus_distribution")).fetchone())


def distributed_sync(conn: psycopg.Connection[Any]) -> bool:
    """Whether the jobs table is distributed now, as `conn` sees it (without Citus: one round
    trip)."""
    return jobs_distributed(conn, citus_version(conn))


async def distributed_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """distributed_sync on an async connection."""
    version = rows.value(await (await conn.execute(query("citus_version"))).fetchone())
    if version is None:
        return False
    return hash_distributed(await (await conn.execute(query("citus_distribution"))).fetchone())


def distribute(dsn: str) -> list[str]:
    """Place an up-to-date schema on the Citus cluster `dsn` names (its coordinator node); the
    steps taken, empty if it was placed already. Raises MigrationError without Citus."""
    done: list[str] = []
    try:
        with connect_migrator(dsn) as conn:
            conn.autocommit = True
            conn.execute(query("citus_split_timeout"))
            version = citus_version(conn)
            if version is None:
                raise MigrationError(
                    "--citus needs the citus extension in this database "
                    "(CREATE EXTENSION citus on every node, then add the worker nodes)"
                )
            for (table,) in conn.execute(query("citus_reference_tables")).fetchall():
                conn.execute(query("citus_make_reference"), {"table": table})
                done.append(f"{table}: reference table")
            if not jobs_distributed(conn, version):
                conn.execute(query("citus_drop_queue_wide_dedupe"))
                # Blocking, not create_distributed_table_concurrently: in our tests rows written
                # right after an online distribution went missing. Writers wait, then go on.
                conn.execute(query("citus_distribute_jobs"))
                conn.execute(query("citus_drop_local_copy"), {"table": "dispatcher_jobs"})
                done.append("dispatcher_jobs: distributed by bucket")
            for shard, points, nodes in conn.execute(query("citus_split_by_bucket")).fetchall():
                conn.execute(
                    query("citus_split_shard"),
                    {"shard": shard, "points": points, "nodes": nodes, "mode": "block_writes"},
                )
                done.append(f"shard {shard} split into {len(nodes)}")
            if conn.execute(query("citus_archive_undistributed")).fetchone() is not None:
                conn.execute(query("citus_distribute_archive"))
                conn.execute(query("citus_drop_local_copy"), {"table": "dispatcher_jobs_archive"})
                done.append("dispatcher_jobs_archive: distributed by bucket, beside the jobs")
    except psycopg.Error as exc:
        raise store_error(exc, "migrate --citus") from exc
    if done:
        log.info("citus: %s (%d buckets, one shard each)", "; ".join(done), NUM_BUCKETS)
    return done
