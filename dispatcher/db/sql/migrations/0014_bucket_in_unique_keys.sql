-- Every unique index of dispatcher_jobs ends with `bucket`, so that the table can be distributed by
-- bucket: a distributed table's unique indexes must hold its distribution column.
--
-- The rules keep their meaning because the keys pick the bucket (dispatcher/api/enqueue.py,
-- _pick_bucket): an ordering key always places its job in its own bucket, and a dedupe key does
-- when no ordering key, partition key or bucket is given. For the jobs a key places, (queue, key,
-- bucket) is unique exactly when (queue, key) is; a dedupe key that another key placed is unique
-- among the live jobs of its bucket. The primary key becomes (id, bucket), id first so that
-- lookups by id still use it; ids stay unique (one identity). Each new index is looser than the
-- one it replaces, so rows that satisfy the old ones cannot fail its build. This release's inserts
-- name no conflict target (sql/enqueue.sql), so they run before and after this migration; an
-- older release's name the old dedupe index and fail once it is gone.
--
-- Written in steps (dispatcher/db/migrate.py), like 0008: the new indexes are built CONCURRENTLY
-- beside the old ones under temporary names, the old ones dropped CONCURRENTLY, then one short
-- transaction swaps the primary key and gives the new indexes the old names (SQL, docs and plans
-- name them). That last step records the version: a run cut short before it is run again from
-- the top, and finds the work of the steps before done.

-- step: autocommit
-- Step 1: the new indexes (SHARE UPDATE EXCLUSIVE: workers read and write all along).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_id_bucket_idx
    ON dispatcher_jobs (id, bucket);

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_ordering_holder_bucket_idx
    ON dispatcher_jobs (queue_name, ordering_key, bucket)
    WHERE ordering_key IS NOT NULL AND (status IN ('queued', 'running') OR ordering_halted);

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_dedupe_live_bucket_idx
    ON dispatcher_jobs (queue_name, dedupe_key, bucket)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running', 'waiting');

-- step: autocommit
-- Step 2: the old unique indexes go; the new ones, with the same predicates, enforce each rule
-- per bucket all along. Safe to run again: the new indexes take these names only in step 3,
-- which records the version.
DROP INDEX CONCURRENTLY IF EXISTS dispatcher_jobs_ordering_holder_idx;

DROP INDEX CONCURRENTLY IF EXISTS dispatcher_jobs_dedupe_live_idx;

-- Statistics on id (SHARE UPDATE EXCLUSIVE: reads and writes go on). The old primary key, on id
-- alone, told the planner that ids are unique; from step 3 on only these statistics do, and a
-- table autovacuum never analyzed has none: `id = ANY(...)` would be planned as a scan.
ANALYZE dispatcher_jobs (id);

-- step: transaction
-- Step 3: catalog changes only (no row is read: id and bucket are NOT NULL already), under
-- ACCESS EXCLUSIVE for milliseconds, bounded by lock_timeout as in 0007. The new primary key
-- takes the old one's name, and its index with it.
SET LOCAL lock_timeout = '5s';

ALTER TABLE dispatcher_jobs
    DROP CONSTRAINT dispatcher_jobs_pkey,
    ADD CONSTRAINT dispatcher_jobs_pkey PRIMARY KEY USING INDEX dispatcher_jobs_id_bucket_idx;

ALTER INDEX dispatcher_jobs_ordering_holder_bucket_idx RENAME TO dispatcher_jobs_ordering_holder_idx;

ALTER INDEX dispatcher_jobs_dedupe_live_bucket_idx RENAME TO dispatcher_jobs_dedupe_live_idx;
