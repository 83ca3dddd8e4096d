-- Distributing the schema over a Citus cluster (dispatcher/db/citus.py, `dispatcher migrate
-- --citus`). One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any
-- file of this folder. Placement and its reasons: docs/concepts/citus.md.

-- name: citus_split_timeout
-- Distributing and splitting copy a shard's rows: far longer than a hot statement may take.
SET statement_timeout = '10min'

-- name: citus_version
-- The citus extension's version in this database; no row without it.
SELECT extversion FROM pg_extension WHERE extname = 'citus'

-- name: citus_distribution
-- How the jobs table is placed now: 'h' (hash-distributed), 'n' (a reference or coordinator-local
-- table), NULL when Citus does not know it; with its shard count.
SELECT p.partmethod::text,
       (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid)
  FROM pg_dist_partition p
 WHERE p.logicalrelid = 'dispatcher_jobs'::regclass

-- name: citus_reference_tables
-- The tables a claim reads beside the jobs (flow control): replicated to every node, so a claim
-- that reads them stays a single-shard router query. Those not yet reference tables.
SELECT t.name
  FROM unnest(ARRAY['dispatcher_flow_control', 'dispatcher_limits', 'dispatcher_paused_queues']) AS t(name)
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                    WHERE p.logicalrelid = t.name::regclass AND p.repmodel = 't')

-- name: citus_make_reference
SELECT create_reference_table(%(table)s)

-- name: citus_drop_queue_wide_dedupe
-- The queue-wide dedupe index that migration 0014 kept for the previous release: a distributed
-- table's unique indexes must hold its distribution column, so the cluster enforces the dedupe
-- rule per bucket (dispatcher_jobs_dedupe_live_bucket_idx).
DROP INDEX CONCURRENTLY IF EXISTS dispatcher_jobs_dedupe_live_idx

-- name: citus_distribute_jobs
-- One shard to start with; the split below gives every bucket a shard of its own.
SELECT create_distributed_table('dispatcher_jobs', 'bucket', shard_count => 1)

-- name: citus_archive_undistributed
-- A row if the archive of completed jobs exists (migration 0020) and is not distributed yet.
SELECT 1
 WHERE to_regclass('dispatcher_jobs_archive') IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM pg_dist_partition AS p
                    WHERE p.logicalrelid = to_regclass('dispatcher_jobs_archive'))

-- name: citus_distribute_archive
-- The archive, colocated with the jobs (each bucket's archive shard on its jobs shard's node, with
-- the same hash ranges, split or not), so that a completion moving a job is a router statement.
-- Its partitions follow it, and so does every partition attached later.
SELECT create_distributed_table('dispatcher_jobs_archive', 'bucket', colocate_with => 'dispatcher_jobs')

-- name: citus_drop_local_copy
-- create_distributed_table leaves the rows it copied in the coordinator's own table, unseen.
SELECT truncate_local_data_after_distributing_table(%(table)s)

-- name: citus_split_by_bucket
-- Split every shard that holds more than one bucket at the hash values between its buckets, so
-- each of the 64 buckets ends in a shard of its own, placed round-robin over the nodes that hold
-- shards. A split point is the largest hash value of the piece below it.
WITH buckets AS (
    SELECT b, worker_hash(b::smallint) AS h,
           get_shard_id_for_distribution_column('dispatcher_jobs', b::smallint) AS shard
      FROM generate_series(0, 63) AS b
),
nodes AS (
    SELECT array_agg(nodeid ORDER BY nodeid) AS ids
      FROM pg_dist_node WHERE shouldhaveshards AND noderole = 'primary' AND isactive
),
splits AS (
    SELECT shard, array_agg(h ORDER BY h) AS hashes, min(b) AS first_bucket
      FROM buckets GROUP BY shard HAVING count(*) > 1
)
SELECT s.shard,
       (SELECT array_agg(x::text ORDER BY x) FROM unnest(s.hashes[1:cardinality(s.hashes) - 1]) AS x),
       (SELECT array_agg(n.ids[1 + (s.first_bucket + i) % cardinality(n.ids)] ORDER BY i)
          FROM generate_series(0, cardinality(s.hashes) - 1) AS i)
  FROM splits AS s CROSS JOIN nodes AS n

-- name: citus_split_shard
SELECT citus_split_shard_by_split_points(%(shard)s, %(points)s::text[], %(nodes)s::int[],
                                         shard_transfer_mode => %(mode)s::citus.shard_transfer_mode)
