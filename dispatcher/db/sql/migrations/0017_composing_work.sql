-- Composing work (docs/concepts/workflows.md): jobs that wait for other jobs (dependencies and
-- batches), the values handlers return (results), what a running handler reports (progress and
-- metadata) and the labels operators search by (tags).
--
-- A job with parents that have not all completed is `blocked`: no claim index holds it, so no
-- claim can take it, in either mode. `pending_parents` counts the parents it still waits for. One
-- row of dispatcher_job_deps per edge still pending: the statement that ends a parent deletes its
-- edges and, in the same statement, counts each child down (or cancels it, by the child's
-- `on_parent_failure`); the child that reaches 0 becomes queued (dispatcher/db/sql/deps.sql).
-- Counting down under the child's row lock is what makes two parents that end at once promote
-- their common child exactly once.
--
-- Written in steps (dispatcher/db/migrate.py), like 0008: catalog changes commit at once, the
-- scans run under locks that let the workers' reads and writes through. Every new column is
-- nullable without a default: a catalog change, and a bit in the null bitmap of a row that does
-- not use it.

-- Step 1, one transaction, catalog only (milliseconds of ACCESS EXCLUSIVE, bounded by lock_timeout
-- as in 0007).
SET LOCAL lock_timeout = '5s';

-- The parents a job was enqueued with (for people: `jobs show`, the dashboard); the pending edges
-- are rows of dispatcher_job_deps.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS depends_on bigint[];
-- How many parents a blocked job still waits for; NULL for a job enqueued without parents.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS pending_parents integer;
-- True once some job depends on this one (set by the child's enqueue, under this row's lock): its
-- completion and its failure then release its edges.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS has_dependents boolean;
-- The batch a job belongs to: the id of the batch's callback job (dispatcher jobs list --batch).
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS batch_id bigint;
-- The handler's return value (JSON), bounded by DISPATCHER_MAX_RESULT_BYTES.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS result jsonb;
-- True once someone awaits the job's result (JobHandle.result): its end then sends a NOTIFY.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS awaited boolean;
-- What a running handler reported: its progress, and metadata it merged in.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS progress jsonb;
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS meta jsonb;
-- Labels given at enqueue, for search and bulk actions.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS tags text[];

ALTER TABLE dispatcher_jobs DROP CONSTRAINT IF EXISTS dispatcher_jobs_status_check;
ALTER TABLE dispatcher_jobs ADD CONSTRAINT dispatcher_jobs_status_check
    CHECK (status IN ('queued', 'running', 'completed', 'failed', 'discarded', 'cancelled', 'waiting', 'blocked'))
    NOT VALID;

-- The pending edges: parent -> child, with what the child does if the parent ends without success
-- ('cancel': the child is cancelled; 'run': it counts as done; 'wait': the edge stays until an
-- operator retries the parent and it completes, or cancels the child). Keyed by the parent (its
-- end reads its edges) and holding both buckets, so that a cluster can place each edge with its
-- parent.
CREATE TABLE IF NOT EXISTS dispatcher_job_deps (
    parent_id         bigint      NOT NULL,
    parent_bucket     smallint    NOT NULL,
    child_id          bigint      NOT NULL,
    child_bucket      smallint    NOT NULL,
    on_parent_failure text        NOT NULL DEFAULT 'cancel'
                      CHECK (on_parent_failure IN ('cancel', 'run', 'wait')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (parent_id, parent_bucket, child_id)
);

-- step: transaction
-- Step 2: VALIDATE scans under SHARE UPDATE EXCLUSIVE (reads and writes go on).
ALTER TABLE dispatcher_jobs VALIDATE CONSTRAINT dispatcher_jobs_status_check;

-- step: autocommit
-- Step 3: indexes, built CONCURRENTLY. Each holds only the rows that use its feature: a job without
-- a batch or tags writes no entry in any of them.

-- Batch members, for the callback's counts and `jobs list --batch`.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_batch_idx
    ON dispatcher_jobs (batch_id, status) WHERE batch_id IS NOT NULL;

-- Tags, for `jobs list --tag` and the dashboard's search (array containment).
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_tags_idx
    ON dispatcher_jobs USING gin (tags) WHERE tags IS NOT NULL;

-- The blocked jobs, for operators and the dependency sweeper's count.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_blocked_idx
    ON dispatcher_jobs (queue_name, id) WHERE status = 'blocked';
