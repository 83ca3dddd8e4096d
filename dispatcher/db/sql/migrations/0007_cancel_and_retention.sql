-- Cancel (a new terminal status, and a request column a running job's owner reads with its
-- heartbeat) and retention (indexes the pruner and the admin filters walk instead of the table).
--
-- Written in steps (dispatcher/db/migrate.py) so that a live table is never locked for long: the
-- catalog changes commit at once, the scans (VALIDATE, index builds) run under locks that let
-- the workers' reads and writes through. Every step but the last is safe to run again.

-- Step 1, one transaction, catalog only: ACCESS EXCLUSIVE on dispatcher_jobs and on
-- dispatcher_job_attempts, for milliseconds: no row is read or rewritten. The lock_timeout bounds
-- the one way this could hurt: waiting behind a long transaction while every claim queues
-- behind us. The migration then fails (run it again) instead of stalling the fleet for longer.
SET LOCAL lock_timeout = '5s';

-- When an operator asked to cancel a running job (dispatcher jobs cancel). Its owner reads it with
-- each heartbeat (jobs_extend_leases) and cancels the handler. Nullable, no default: no rewrite.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;

-- `cancelled`: a terminal status, never retried. The CHECK is replaced NOT VALID (no scan here) and
-- validated in step 2. Every row already satisfies it: the new list holds the old one.
ALTER TABLE dispatcher_jobs DROP CONSTRAINT IF EXISTS dispatcher_jobs_status_check;
ALTER TABLE dispatcher_jobs ADD CONSTRAINT dispatcher_jobs_status_check
    CHECK (status IN ('queued', 'running', 'completed', 'failed', 'discarded', 'cancelled')) NOT VALID;

ALTER TABLE dispatcher_job_attempts DROP CONSTRAINT IF EXISTS dispatcher_job_attempts_outcome_check;
ALTER TABLE dispatcher_job_attempts ADD CONSTRAINT dispatcher_job_attempts_outcome_check
    CHECK (outcome IN ('completed', 'retried', 'failed', 'discarded', 'released', 'cancelled')) NOT VALID;

-- step: transaction
-- Step 2: VALIDATE scans each table under SHARE UPDATE EXCLUSIVE, which lets reads and writes
-- through (it only excludes other DDL and VACUUM). Measured: 0.12 s for 500k jobs and 500k
-- history rows; the catalog step before it, 3 ms.
ALTER TABLE dispatcher_jobs VALIDATE CONSTRAINT dispatcher_jobs_status_check;
ALTER TABLE dispatcher_job_attempts VALIDATE CONSTRAINT dispatcher_job_attempts_outcome_check;

-- step: autocommit
-- Step 3: indexes, built CONCURRENTLY (SHARE UPDATE EXCLUSIVE: workers read and write all along;
-- the build waits for transactions older than itself). Each costs writes only for the rows it
-- holds, which are never the claim's: a claim (queued -> running) and a retry (running -> queued)
-- insert into none of them. Each built in 0.16-0.21 s here at 500k rows.

-- Finished jobs by the time they finished (updated_at is written with every status change and
-- never after a job is finished). Serves the pruner (DELETE of the oldest rows past retention:
-- an index range, 1,000 rows a statement, instead of a scan of the whole table every minute), the
-- janitor's lag (min(updated_at): one index descent), and the admin commands' status and age
-- filters. Costs one index insert per completion: the completion flush of 2,000 jobs went from
-- 14.3 to 15.6 ms (medians of 60 each, +9%, ~0.65 us a job) with it, at 500k jobs; a claim of 2,000
-- took the same with or without it (33-34 ms, within the noise).
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_completed_idx
    ON dispatcher_jobs (updated_at) WHERE status = 'completed';

-- Jobs that ended without success: failed, discarded, cancelled, for the pruner and the admin
-- filters, which dispatcher_jobs_failed_idx (queue_name, failed_at) WHERE status = 'failed' cannot
-- serve for discarded or cancelled jobs, nor in age order. That one stays: failures are counted
-- per queue through it, index-only. Written only when a job ends so (rare).
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_unsuccessful_idx
    ON dispatcher_jobs (updated_at) WHERE status IN ('failed', 'discarded', 'cancelled');

-- History rows by age, for the pruner (history is append-only: each insert lands at the right
-- edge of this index). Costs one index insert per history row, only with DISPATCHER_HISTORY on.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_job_attempts_finished_idx
    ON dispatcher_job_attempts (finished_at);
