-- What the demo and the worker-process harness read of the database to measure a run
-- (dispatcher/devtools/demo.py, harness.py). Not used by the runtime.

-- name: measure_reset_jobs
-- An empty jobs table before each measured run.
TRUNCATE dispatcher_jobs

-- name: measure_clock
-- The database clock: runs are timed on it, like the jobs' own timestamps.
SELECT clock_timestamp()

-- name: measure_spans
-- Seconds to the first claim and to the last completion, from %(since)s or the first claim.
SELECT extract(epoch FROM min(locked_at) - coalesce(%(since)s, min(locked_at)))::float8,
                  extract(epoch FROM max(completed_at) - coalesce(%(since)s, min(locked_at)))::float8
             FROM dispatcher_jobs

-- name: measure_table_counters
-- The claim indexes' reads, heap fetches, dead rows, completed jobs and autovacuum runs.
SELECT coalesce(sum(i.idx_tup_read) FILTER (WHERE i.indexrelname LIKE 'dispatcher_jobs_claim%%'), 0),
                  t.idx_tup_fetch, t.n_dead_tup,
                  (SELECT count(*) FROM dispatcher_jobs WHERE status = 'completed'),
                  t.autovacuum_count + t.autoanalyze_count
             FROM pg_stat_user_tables t JOIN pg_stat_user_indexes i ON i.relid = t.relid
            WHERE t.relname = 'dispatcher_jobs'
            GROUP BY t.idx_tup_fetch, t.n_dead_tup, t.autovacuum_count, t.autoanalyze_count

-- name: measure_lock_waiters
-- Sessions of this database waiting for a lock now.
SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'

-- name: measure_completed_jobs
SELECT count(*) FROM dispatcher_jobs WHERE status = 'completed'

-- name: measure_jobs_left
-- Jobs not finished yet: queued (a retry too), running, or waiting behind their ordering key's
-- holder. What a drain's watch counts down, the same whether completions keep their rows or
-- delete them (DISPATCHER_COMPLETED_JOBS=delete).
SELECT count(*) FROM dispatcher_jobs WHERE status IN ('queued', 'running', 'waiting')
