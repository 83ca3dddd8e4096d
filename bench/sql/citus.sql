-- What `python -m bench citus` and `citus_faults` (bench/citus.py) read besides the drain's figures.

-- name: citus_bucket_nodes
-- The port of the node holding each bucket's shard (one shard per bucket: dispatcher/db/citus.py).
SELECT b AS bucket, n.nodeport
  FROM generate_series(0, %(buckets)s - 1) AS b
  JOIN pg_dist_placement AS p
    ON p.shardid = get_shard_id_for_distribution_column('dispatcher_jobs', b::smallint)
  JOIN pg_dist_node AS n ON n.groupid = p.groupid
 ORDER BY b

-- name: citus_completed_per_bucket
SELECT bucket, count(*) FROM dispatcher_jobs WHERE status = 'completed' GROUP BY bucket

-- name: citus_status_counts
SELECT status::text, count(*) FROM dispatcher_jobs GROUP BY 1

-- name: citus_claimed_again
-- Jobs claimed more than once: a killed worker's claims that came back when their lease expired.
SELECT count(*) FROM dispatcher_jobs WHERE attempts > 1

-- name: citus_statements
-- This database's statements on this node, the bench's own (its role's) left out: on a worker
-- node, what the coordinator node sent there for the clients.
SELECT s.query, s.calls, s.total_exec_time, s.rows, s.shared_blks_hit + s.shared_blks_read
  FROM pg_stat_statements AS s
  JOIN pg_database AS d ON d.oid = s.dbid
  JOIN pg_roles AS r ON r.oid = s.userid
 WHERE d.datname = current_database() AND r.rolname <> %(meter)s

-- name: citus_meter_backends
-- The bench's own backends on this node: its sessions, and on a worker node the coordinator
-- node's connections for them.
SELECT pid FROM pg_stat_activity WHERE usename = %(meter)s

-- name: citus_settings
SELECT name, setting FROM pg_settings
 WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'wal_level',
                'shared_preload_libraries', 'max_connections')
