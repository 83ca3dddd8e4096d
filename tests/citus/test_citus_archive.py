"""The archive of completed jobs on a distributed jobs table: `migrate --citus` distributes it by
bucket, colocated with the jobs (in place, on a cluster that upgrades to it), and the single-node
tests of tests/integration/test_archive.py run on the cluster: a completion moves each job to its
bucket's archive shard, the readers find it there, the janitor's partitions are distributed as
they are created and dropped past retention."""

from __future__ import annotations

import psycopg
import pytest

from dispatcher.db.citus import distribute
from dispatcher.db.migrate import migrate
from tests.helpers import fetchall
from tests.integration.test_archive import (  # noqa: F401  # tests, run here on the cluster
    ARCHIVE,
    test_a_worker_under_archive_moves_every_success_and_keeps_every_other_end,
    test_the_archive_has_the_jobs_columns_in_their_order_and_the_move_writes_every_one,
    test_the_other_settings_leave_the_archive_empty,
    test_the_pruner_under_archive_never_retires_even_with_completed_kept_forever,
)

COLOCATION = """
SELECT logicalrelid::text, colocationid,
       (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid)
  FROM pg_dist_partition AS p
 WHERE logicalrelid::text IN ('dispatcher_jobs', 'dispatcher_jobs_archive')
 ORDER BY 1
"""


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn


def test_a_cluster_that_upgrades_gets_its_archive_colocated_with_the_jobs(citus_empty_dsn):
    """A cluster distributed before the archive existed: the migration creates it on the
    coordinator node, `migrate --citus` distributes it beside the jobs (the same shards' hash
    ranges, 64 of them), with the partitions made so far and those made later."""
    migrate(citus_empty_dsn, up_to=ARCHIVE - 1)
    distribute(citus_empty_dsn)
    assert migrate(citus_empty_dsn, up_to=ARCHIVE) == [ARCHIVE]
    steps = distribute(citus_empty_dsn)
    assert steps == ["dispatcher_jobs_archive: distributed by bucket, beside the jobs"]
    (jobs, archive) = fetchall(citus_empty_dsn, COLOCATION)
    assert jobs[1] == archive[1] and jobs[2] == archive[2] == 64, (jobs, archive)
    with psycopg.connect(citus_empty_dsn, autocommit=True) as conn:
        made = conn.execute("SELECT created FROM dispatcher_archive_maintain(900, 1800, 0, 0)")
        assert made.fetchone()[0] > 0
        unplaced = conn.execute(
            "SELECT count(*) FROM pg_inherits AS i "
            "WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass AND NOT EXISTS "
            "(SELECT 1 FROM pg_dist_partition AS p WHERE p.logicalrelid = i.inhrelid "
            "AND p.colocationid = (SELECT colocationid FROM pg_dist_partition "
            "WHERE logicalrelid = 'dispatcher_jobs'::regclass))"
        ).fetchone()[0]
    assert unplaced == 0, "a partition created later is distributed beside the jobs"
    assert distribute(citus_empty_dsn) == []
