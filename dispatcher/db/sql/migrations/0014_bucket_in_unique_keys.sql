-- Every unique index of the jobs table includes `bucket`, so that the table can be distributed by
-- bucket (`dispatcher migrate --citus`; a distributed table's unique indexes must include its
-- distribution column) in place, without another migration.
--
-- The rules keep their meaning because the keys pick the bucket (dispatcher/api/enqueue.py): an
-- ordering key always places its job in bucket_for(key), and a dedupe key does when no ordering
-- key, partition key or bucket is given. So (queue, key, bucket) is unique exactly when (queue,
-- key) is. The primary key becomes (id, bucket): id first, so lookups by id still use it; ids
-- stay unique (one identity sequence).
--
-- Written in steps (dispatcher/db/migrate.py), like 0008: the new indexes are built CONCURRENTLY
-- beside the old ones (reads and writes go on), then swapped in by catalog changes.

-- step: autocommit
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_id_bucket_idx
    ON dispatcher_jobs (id, bucket);

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_ordering_holder_bucket_idx
    ON dispatcher_jobs (queue_name, ordering_key, bucket)
    WHERE ordering_key IS NOT NULL AND (status IN ('queued', 'running') OR ordering_halted);

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS dispatcher_jobs_dedupe_live_bucket_idx
    ON dispatcher_jobs (queue_name, dedupe_key, bucket)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running', 'waiting');

-- step: transaction
-- The swap: catalog changes only, under a short lock. The new primary key takes the old name.
SET LOCAL lock_timeout = '5s';
ALTER TABLE dispatcher_jobs
    DROP CONSTRAINT dispatcher_jobs_pkey,
    ADD CONSTRAINT dispatcher_jobs_pkey PRIMARY KEY USING INDEX dispatcher_jobs_id_bucket_idx;
DROP INDEX dispatcher_jobs_ordering_holder_idx;
ALTER INDEX dispatcher_jobs_ordering_holder_bucket_idx RENAME TO dispatcher_jobs_ordering_holder_idx;
DROP INDEX dispatcher_jobs_dedupe_live_idx;
ALTER INDEX dispatcher_jobs_dedupe_live_bucket_idx RENAME TO dispatcher_jobs_dedupe_live_idx;
