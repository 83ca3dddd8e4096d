-- Ordering keys (docs/concepts/ordering.md): jobs of one queue that share an `ordering_key` run one
-- at a time, in enqueue order, across the fleet, and the database is what guarantees it.
--
-- At most one job of a key is its *holder*: queued (due or waiting for its retry), running, or
-- failed and halting the key (`ordering_halted`). A unique index holds that rule, so no claim, in
-- either mode, by any number of workers, can ever run two jobs of a key at once. Every later job
-- of the key waits in the new status 'waiting', which no claim index holds, so the claims never
-- read past them. The statement that ends a holder promotes the key's next waiting job (lowest id)
-- in the same fenced write (dispatcher/db/sql/ordering.sql). Jobs without a key carry NULLs and
-- are in none of the new indexes.
--
-- Written in steps (dispatcher/db/migrate.py), like 0007: catalog changes commit at once, scans
-- run under locks that let the workers' reads and writes through.

-- Step 1, one transaction, catalog only (milliseconds of ACCESS EXCLUSIVE; no row is rewritten:
-- a nullable column, and a NOT NULL one with a constant default, are catalog changes).
SET LOCAL lock_timeout = '5s';

ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS ordering_key text;
-- True while a finally failed (or discarded) job holds its key: the key's later jobs wait until
-- an operator retries or cancels it (`dispatcher jobs list --halted`).
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS ordering_halted boolean NOT NULL DEFAULT false;

ALTER TABLE dispatcher_jobs DROP CONSTRAINT IF EXISTS dispatcher_jobs_status_check;
ALTER TABLE dispatcher_jobs ADD CONSTRAINT dispatcher_jobs_status_check
    CHECK (status IN ('queued', 'running', 'completed', 'failed', 'discarded', 'cancelled', 'waiting')) NOT VALID;

-- step: transaction
-- Step 2: VALIDATE scans under SHARE UPDATE EXCLUSIVE (reads and writes go on).
ALTER TABLE dispatcher_jobs VALIDATE CONSTRAINT dispatcher_jobs_status_check;

-- step: autocommit
-- Step 3: indexes, built CONCURRENTLY. Each holds keyed rows only: a job without a key writes
-- no entry in any of them, ever.

-- The rule itself: one holder per (queue, key). Entered when a keyed job is promoted or enqueued
-- as its key's first job; a claim (queued -> running) and a retry (running -> queued) keep it.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_ordering_holder_idx
    ON dispatcher_jobs (queue_name, ordering_key)
    WHERE ordering_key IS NOT NULL AND (status IN ('queued', 'running') OR ordering_halted);

-- The jobs behind each holder, in order: a promotion reads the first entry of one key's range.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_ordering_waiting_idx
    ON dispatcher_jobs (queue_name, ordering_key, id) WHERE status = 'waiting';

-- A waiting job is live: it holds its dedupe key like a queued one. Replaces
-- dispatcher_jobs_dedupe_idx (queued, running), which the statement after this one drops.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_dedupe_live_idx
    ON dispatcher_jobs (queue_name, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running', 'waiting');

DROP INDEX CONCURRENTLY IF EXISTS dispatcher_jobs_dedupe_idx;
