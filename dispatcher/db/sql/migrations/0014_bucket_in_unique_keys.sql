-- Every rule of dispatcher_jobs gets a unique index that ends with `bucket`, so that the table can
-- be distributed by bucket in place: a distributed table's unique indexes must hold its
-- distribution column (`dispatcher migrate --citus`, dispatcher/db/citus.py).
--
-- The rules keep their meaning because the keys pick the bucket (dispatcher/api/enqueue.py,
-- _pick_bucket): an ordering key always places its job in its own bucket, and a dedupe key does
-- when no ordering key, partition key or bucket is given. For the jobs a key places, (queue, key,
-- bucket) is unique exactly when (queue, key) is. The primary key becomes (id, bucket), id first
-- so that lookups by id still use it; ids stay unique (one identity).
--
-- The queue-wide dedupe index (queue_name, dedupe_key) stays beside its per-bucket twin on one
-- node: the previous release's inserts name it as their conflict target and would fail without
-- it during a rolling upgrade, and it keeps a dedupe key given beside another key unique in its
-- whole queue, as before. `migrate --citus` drops it (a cluster enforces the rule per bucket); a
-- later release drops it everywhere. This release's inserts name no conflict target
-- (sql/enqueue.sql): either index turns a duplicate into a no-op.
--
-- Written in steps (dispatcher/db/migrate.py), like 0008: the new indexes are built CONCURRENTLY
-- beside the old ones, the old holder index dropped CONCURRENTLY, then one short transaction swaps
-- the primary key and gives the new holder index the old name (SQL, docs and plans name it). That
-- last step records the version: a run cut short before it is run again from the top, and finds
-- the work of the steps before done.

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
-- Step 2: the old holder index goes; the new one, with the same predicate, enforces the rule all
-- along (a key's jobs share its bucket). Safe to run again: the new index takes this name only in
-- step 3, which records the version.
DROP INDEX CONCURRENTLY IF EXISTS dispatcher_jobs_ordering_holder_idx;

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
