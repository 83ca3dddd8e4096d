-- The readings of `python -m bench churn` (bench/churn.py): how the jobs table ages under a
-- steady stream of jobs.

-- name: churn_sample
-- The jobs table's size (heap, and its indexes), its dead and live tuples as the statistics
-- have them (up to a second late), the autovacuums so far, and the WAL written since initdb;
-- and the archive's size (its partitions, indexes included) and dead tuples.
SELECT pg_table_size('dispatcher_jobs') AS table_bytes,
       pg_indexes_size('dispatcher_jobs') AS indexes_bytes,
       s.n_dead_tup AS dead_tuples,
       s.n_live_tup AS live_tuples,
       s.autovacuum_count AS autovacuums,
       (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8 AS wal_bytes,
       (SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits AS i
         WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass)::float8 AS archive_bytes,
       (SELECT coalesce(sum(a.n_dead_tup), 0) FROM pg_stat_user_tables AS a
         WHERE a.relid IN (SELECT i.inhrelid FROM pg_inherits AS i
                            WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass))::float8
           AS archive_dead_tuples
  FROM pg_stat_user_tables AS s
 WHERE s.relname = 'dispatcher_jobs'

-- name: churn_prune_completed
-- One batch of a retention pass under DISPATCHER_COMPLETED_JOBS=keep: the oldest %(limit)s
-- completed rows, deleted as the pruner deletes them (by id, oldest finish first). Returns how
-- many went.
WITH gone AS (
    DELETE FROM dispatcher_jobs
     WHERE id = ANY(ARRAY(
               SELECT id FROM dispatcher_jobs
                WHERE status = 'completed'
                ORDER BY updated_at
                LIMIT %(limit)s))
    RETURNING 1
)
SELECT count(*) FROM gone

-- name: churn_archive_droppable
-- Under DISPATCHER_COMPLETED_JOBS=archive: the archived rows a retention pass run now drops (those
-- of the partitions wholly in the past), counted before the pass.
WITH ended AS (
    SELECT max(substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']+)'\)$r$)::timestamptz) AS to_at
      FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass
       AND substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']+)'\)$r$)::timestamptz <= now()
)
SELECT count(*) FROM dispatcher_jobs_archive WHERE completed_at < (SELECT to_at FROM ended)

-- name: churn_archive_pass
-- The janitor's retention pass under archive, with a retention that has every partition wholly in
-- the past dropped: how many were.
SELECT dropped FROM dispatcher_archive_maintain(60, 0, 0.001, 1000)
