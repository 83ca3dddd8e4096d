-- The readings of `python -m bench churn` (bench/churn.py): how the jobs table ages under a
-- steady stream of jobs.

-- name: churn_sample
-- The jobs table's size (heap, and its indexes), its dead and live tuples as the statistics
-- have them (up to a second late), the autovacuums so far, and the WAL written since initdb.
SELECT pg_table_size('dispatcher_jobs') AS table_bytes,
       pg_indexes_size('dispatcher_jobs') AS indexes_bytes,
       s.n_dead_tup AS dead_tuples,
       s.n_live_tup AS live_tuples,
       s.autovacuum_count AS autovacuums,
       (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8 AS wal_bytes
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
