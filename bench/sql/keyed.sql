-- What `python -m bench keyed` (bench/keyed.py) reads besides the figures every run has.

-- name: keyed_ordering_index_reads
-- Index entries read so far through the ordering indexes (migration 0008: the holder index, read
-- by every keyed enqueue and promotion's conflict and holder checks, and the waiting index, read
-- by each promotion for its key's next job).
SELECT coalesce(sum(idx_tup_read), 0)
  FROM pg_stat_user_indexes
 WHERE relname = 'dispatcher_jobs' AND indexrelname LIKE 'dispatcher_jobs_ordering%%'

-- name: keyed_flush_own_stats
-- This session's pending statistics are written out when it goes idle after this statement
-- (otherwise at most once a second: the counts of a statement just run may not be there yet).
SELECT pg_stat_force_next_flush()
