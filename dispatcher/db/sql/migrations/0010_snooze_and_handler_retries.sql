-- Snooze and per-handler retries (docs/guides/jobs.md).
--
-- `max_attempts_given` says whether the enqueue gave max_attempts: if not, the handler's own
-- max_attempts applies (@registry.handler(max_attempts=...)), else the default 20. The column
-- max_attempts stays NOT NULL and is written 20 when none was given, so a worker of the previous
-- release, which reads it as before, goes on working through a rolling upgrade (it retries such a
-- job up to 20 times). Rows enqueued before this migration read `true`: the 20 they were given
-- still wins over a handler's setting. A job that snoozes (`raise Snooze(s)`) counts its snoozes
-- in `snoozes`, and its attempts keep an outcome of their own in the history.
--
-- Written in steps (dispatcher/db/migrate.py), like 0007: catalog changes commit at once, the
-- scan (VALIDATE) runs under a lock that lets the workers' reads and writes through.

-- Step 1, one transaction, catalog only (milliseconds of ACCESS EXCLUSIVE; no row is read or
-- rewritten: adding a NOT NULL column with a constant default is a catalog change).
SET LOCAL lock_timeout = '5s';

ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS max_attempts_given boolean NOT NULL DEFAULT true;
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0;

ALTER TABLE dispatcher_job_attempts DROP CONSTRAINT IF EXISTS dispatcher_job_attempts_outcome_check;
ALTER TABLE dispatcher_job_attempts ADD CONSTRAINT dispatcher_job_attempts_outcome_check
    CHECK (outcome IN ('completed', 'retried', 'failed', 'discarded', 'released', 'cancelled', 'snoozed')) NOT VALID;

-- step: transaction
-- Step 2: VALIDATE scans the history under SHARE UPDATE EXCLUSIVE (reads and writes go on).
ALTER TABLE dispatcher_job_attempts VALIDATE CONSTRAINT dispatcher_job_attempts_outcome_check;
