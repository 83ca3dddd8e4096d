-- The SKIP LOCKED claim index answers only the queries written for it. Its predicate carries a
-- tag, `priority > -32769` (true for every smallint), that those queries state and no partitioned
-- or stealing query states or can derive, so the planner can never walk it for a bucket-scoped
-- claim, whatever the statistics say. It did, twice: on a freshly filled table (each bucket branch
-- filtered 2,000 entries per 33 claimed), and for steals planned while the table was empty (a
-- cached plan walked the whole queue's index filtering on bucket: ~100 index entries per job).
-- Rebuilt without CONCURRENTLY: this ships before any release holds a large table.
DROP INDEX dispatcher_jobs_claim_idx;
CREATE INDEX dispatcher_jobs_claim_idx
    ON dispatcher_jobs (queue_name, priority, run_at, id) WHERE status = 'queued' AND priority > -32769;
