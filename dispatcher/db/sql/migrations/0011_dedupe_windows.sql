-- Uniqueness windows (docs/guides/jobs.md, docs/design/enqueue.md): a job enqueued with
-- `dedupe_window_s` holds its (queue, dedupe_key) while it is live and for that many seconds after
-- it finished, whatever became of its row since.
--
-- One row per (queue, dedupe_key) in dispatcher_dedupe_windows names the key's last job enqueued
-- with a window. When that job finished is read from the job's row while it exists (updated_at:
-- written with every status change, never after a job is finished), or from `finished_at`, which
-- every statement that deletes a job with a window writes in the same statement (completion under
-- DISPATCHER_COMPLETED_JOBS=delete, the pruner, `dispatcher jobs purge`). Jobs without a window
-- never touch the table; the live rule stays dispatcher_jobs_dedupe_live_idx.
--
-- Step 1, one transaction: the new table, and a nullable column on dispatcher_jobs (a catalog
-- change, milliseconds of ACCESS EXCLUSIVE, no row rewritten), bounded by lock_timeout as in 0007.
SET LOCAL lock_timeout = '5s';

-- The window a job was enqueued with (NULL: none, the common case). The statements that delete
-- jobs read it to know which deleted rows have a window row to close.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS dedupe_window_s double precision;

CREATE TABLE IF NOT EXISTS dispatcher_dedupe_windows (
    queue_name  text             NOT NULL,
    dedupe_key  text             NOT NULL,
    job_id      bigint           NOT NULL,
    window_s    double precision NOT NULL CHECK (window_s > 0),
    -- When the job was enqueued: the earliest it can have finished. Only a job deleted by
    -- something that does not close windows (a worker of an older release, a manual DELETE)
    -- leaves its window to count from here.
    enqueued_at timestamptz      NOT NULL DEFAULT now(),
    -- When the job finished, written as its row is deleted; NULL while the row exists.
    finished_at timestamptz,
    -- Not before this may the pruner delete the row: a lower bound of when the window ends,
    -- pushed on by the pruner while the job is live or its window still open.
    prune_after timestamptz      NOT NULL,
    PRIMARY KEY (queue_name, dedupe_key)
);

-- The pruner's pages, oldest first.
CREATE INDEX IF NOT EXISTS dispatcher_dedupe_windows_prune_idx ON dispatcher_dedupe_windows (prune_after);

-- Windows by job: the statements that delete jobs find the windows to close from the ids of the
-- deleted jobs that had one (sql/dedupe.sql, dedupe_windows_close).
CREATE INDEX IF NOT EXISTS dispatcher_dedupe_windows_job_idx ON dispatcher_dedupe_windows (job_id);

-- step: autocommit
-- Step 2: the running jobs that have a window, built CONCURRENTLY (reads and writes go on). The
-- completion under DISPATCHER_COMPLETED_JOBS=delete finds the windows to close through it
-- (sql/dedupe.sql): a job without a window never has an entry, so a batch of them reads one page.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_windowed_running_idx
    ON dispatcher_jobs (id) WHERE dedupe_window_s IS NOT NULL AND status = 'running';
