-- The minimal table of `python -m bench drain` (bench/minimal.py): the physical limit every
-- drain result states its ratio to. Three columns and one partial index on the queued rows in
-- claim order, nothing else: no lease, token, bucket, timestamps or finished-row index. Like
-- ours, `status` is in the index's predicate, so no status change is a HOT update.

-- name: minimal_drop
DROP TABLE IF EXISTS bench_minimal_jobs

-- name: minimal_create
CREATE TABLE bench_minimal_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL
)

-- name: minimal_index
CREATE INDEX bench_minimal_jobs_queued ON bench_minimal_jobs (id) WHERE status = 'queued'

-- name: minimal_fill
-- %(jobs)s queued jobs with the runtime's no-op payload, in one statement.
INSERT INTO bench_minimal_jobs (payload) SELECT '{}'::jsonb FROM generate_series(1, %(jobs)s)

-- name: minimal_analyze
ANALYZE bench_minimal_jobs

-- name: minimal_claim
-- %(limit)s queued jobs in id order, skipping those another drainer holds.
UPDATE bench_minimal_jobs SET status = 'running'
 WHERE id = ANY(ARRAY(SELECT id FROM bench_minimal_jobs WHERE status = 'queued'
                       ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
RETURNING id, payload

-- name: minimal_complete
UPDATE bench_minimal_jobs SET status = 'done' WHERE id = ANY(%(ids)s::bigint[])

-- name: minimal_complete_delete
-- The completion that deletes (kind minimal_delete): one heap row version less per job.
DELETE FROM bench_minimal_jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: minimal_not_done
-- Jobs left queued or running (0 after a full drain, whichever the completion).
SELECT count(*) FROM bench_minimal_jobs WHERE status <> 'done'

-- name: minimal_index_reads
-- Entries read from the claim's partial index (statistics a backend flushes at exit).
SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE indexrelname = 'bench_minimal_jobs_queued'
