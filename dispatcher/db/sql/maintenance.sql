-- One-pod-at-a-time upkeep (dispatcher/runtime/): reaping expired leases, pruning finished jobs
-- and history, planner statistics, the maintenance leases.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code
-- with validated integers only.

-- name: jobs_lease_expired
-- Running jobs whose lease ran out (their worker died or stalled), oldest expiry first, with
-- what the retry policy needs (dispatcher/runtime/retry.py). No row locks: the write that follows
-- (jobs_fail_owned with lease_expired) is fenced by each job's token and re-checks the expiry,
-- so reapers in N pods, or an owner that comes back to life, never double-write a job. A job
-- with a cancel request is not retried: it ends 'cancelled'.
SELECT id, lock_token::text, attempts, CASE WHEN max_attempts_given THEN max_attempts END, lease_expiries + 1,
       locked_by, locked_at,
       cancel_requested_at IS NOT NULL, job_type, ordering_key IS NOT NULL, bucket
  FROM dispatcher_jobs
 WHERE status = 'running' AND lease_expires_at < now()
 ORDER BY lease_expires_at
 LIMIT %(limit)s

-- name: prune_try_lock
-- The pruner's round runs in one transaction that first takes this lock, without waiting: one
-- pod at a time prunes, the others skip the round. Transaction-scoped, so it works through
-- PgBouncer in transaction pooling and is gone with the transaction, whatever happens to us.
SELECT pg_try_advisory_xact_lock(7022450132)

-- name: jobs_prune_completed
-- Delete up to %(limit)s completed jobs finished more than %(retention_s)s ago, oldest first:
-- one range of dispatcher_jobs_completed_idx (updated_at is when a job finished; nothing
-- writes a finished row after that). 1,000 of 250k completed rows: 1.7 ms, 2,000 buffers; the
-- query it replaces scanned the whole table (70 ms at 500k rows) every minute, even with
-- nothing to delete. SKIP LOCKED: a row an operator is retrying right now is left for later.
-- A deleted job with a uniqueness window leaves its finish time in it ({close_windows}, sql/dedupe.sql).
-- Returns how many were deleted. {and_bucket}: empty on one node; on a Citus cluster the janitor
-- pins each statement to one bucket (`AND bucket = %(bucket)s`), which makes it a router query
-- (Citus refuses FOR UPDATE over several shards).
WITH gone AS (
    DELETE FROM dispatcher_jobs
     WHERE id = ANY(ARRAY(
               SELECT id
                 FROM dispatcher_jobs
                WHERE status = 'completed' AND updated_at < now() - %(retention_s)s * interval '1 second'
                  {and_bucket}
                ORDER BY updated_at
                LIMIT %(limit)s
                  FOR UPDATE SKIP LOCKED)) {and_bucket}
    RETURNING id, queue_name, dedupe_key, dedupe_window_s, updated_at AS finished_at
),
{close_windows}
SELECT count(*) FROM gone

-- name: jobs_prune_unsuccessful
-- The same for jobs that ended failed, discarded or cancelled, through
-- dispatcher_jobs_unsuccessful_idx (1,000 rows: 1.9 ms at 500k rows). A job that halts its
-- ordering key is never deleted: it holds the key's later jobs until an operator retries,
-- cancels or purges it (`dispatcher jobs list --halted`), and with it gone they would run.
WITH gone AS (
    DELETE FROM dispatcher_jobs
     WHERE id = ANY(ARRAY(
               SELECT id
                 FROM dispatcher_jobs
                WHERE status IN ('failed', 'discarded', 'cancelled')
                  AND updated_at < now() - %(retention_s)s * interval '1 second'
                  AND NOT ordering_halted {and_bucket}
                ORDER BY updated_at
                LIMIT %(limit)s
                  FOR UPDATE SKIP LOCKED)) {and_bucket}
    RETURNING id, queue_name, dedupe_key, dedupe_window_s, updated_at AS finished_at
),
{close_windows}
SELECT count(*) FROM gone

-- name: history_prune
-- Delete up to %(limit)s history rows older than %(retention_s)s, oldest first, through
-- dispatcher_job_attempts_finished_idx, by ctid (the table has no key): a TID scan of exactly
-- those rows (1,000 of 500k: 0.9 ms). Only the pruner deletes history, one pod at a time.
DELETE FROM dispatcher_job_attempts
 WHERE ctid = ANY(ARRAY(
           SELECT ctid
             FROM dispatcher_job_attempts
            WHERE finished_at < now() - %(retention_s)s * interval '1 second'
            ORDER BY finished_at
            LIMIT %(limit)s))

-- name: janitor_ages
-- Age in seconds of the oldest row of each kind the pruner deletes (NULL: none), from which its
-- lag is computed (age - retention). One index descent each: 0.07 ms at 500k jobs.
SELECT extract(epoch FROM now() - (SELECT min(updated_at) FROM dispatcher_jobs WHERE status = 'completed'))::float8,
       extract(epoch FROM now() - (SELECT min(updated_at) FROM dispatcher_jobs
                                    WHERE status IN ('failed', 'discarded', 'cancelled')))::float8,
       extract(epoch FROM now() - (SELECT min(finished_at) FROM dispatcher_job_attempts))::float8

-- name: jobs_analyze_if_stale
-- Refresh planner statistics when the table has outgrown them: with a freshly filled table
-- still marked empty, each claim branch walked the SKIP LOCKED index and filtered on bucket
-- (2,000 index entries read per 30 claimed). Growth, not churn: rows arrive by INSERT, and
-- n_live_tup counts inserts and deletes, not updates. Counting modifications instead, a 200k
-- drain (400k updates: claim, then completion) fired it 2-4 times, 120-230 ms each, 0.6-3.3 us of
-- PostgreSQL per job, for statistics no claim plan needs; autovacuum's ANALYZE (at 2% of
-- changes, see 0001_jobs.sql) follows the churn. One pod at a time (try-lock, never waits).
-- Only a role ANALYZE accepts gets that far: the table's owner, the database's owner, or (17+)
-- one with MAINTAIN on it. For others ANALYZE only warns on the server and skips the table, so
-- we raise insufficient_privilege instead, and the worker stops asking (PlannerStats).
DO $$
DECLARE
    permitted boolean;
BEGIN
    SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE') INTO permitted
      FROM pg_class c, pg_database d
     WHERE c.oid = 'dispatcher_jobs'::regclass AND d.datname = current_database();
    IF NOT permitted AND current_setting('server_version_num')::int >= 170000 THEN
        permitted := has_table_privilege('dispatcher_jobs', 'MAINTAIN');  -- an error before 17
    END IF;
    IF NOT permitted THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'role ' || quote_ident(current_user) || ' may not ANALYZE dispatcher_jobs',
            HINT = CASE WHEN current_setting('server_version_num')::int >= 170000
                        THEN 'GRANT MAINTAIN ON dispatcher_jobs TO ' || quote_ident(current_user)
                        ELSE 'nothing to grant before PostgreSQL 17, where only the owner of the '
                             'table or of the database may ANALYZE it (17 has GRANT MAINTAIN)' END;
    END IF;
    IF pg_try_advisory_xact_lock(7022450131) AND EXISTS (
        SELECT 1 FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE c.oid = 'dispatcher_jobs'::regclass
           AND (c.reltuples < 0 OR s.n_live_tup > greatest(10000, c.reltuples * 2)))
    THEN
        -- the columns of jobs_analyze (sql/enqueue.sql says why these)
        ANALYZE dispatcher_jobs (id, queue_name, status, bucket, priority, run_at, lease_expires_at, completed_at,
                                 failed_at, updated_at);
    END IF;
END
$$

-- name: jobs_autovacuum_on
-- Whether autovacuum keeps dispatcher_jobs' planner statistics fresh: on for the server (with
-- track_counts, which it needs) and not turned off for the table. What PlannerStats checks once,
-- for a role that may not ANALYZE (jobs_analyze_if_stale): while this holds that is no problem.
SELECT current_setting('autovacuum')::boolean
   AND current_setting('track_counts')::boolean
   AND coalesce((SELECT o.option_value::boolean
                   FROM pg_options_to_table(c.reloptions) o
                  WHERE o.option_name = 'autovacuum_enabled'), true)
  FROM pg_class c
 WHERE c.oid = 'dispatcher_jobs'::regclass

-- name: maintenance_lease_take
-- Take or renew the one-pod-at-a-time role %(name)s for %(ttl_s)s seconds, in ONE statement on
-- the database's clock: inserted if nobody ever held it; else taken over only if its lease ran
-- out, renewed only by its holder. A row back means we hold it. No session state (PgBouncer).
-- %(yielding)s: holders that give way to us at once (the schedules of an older release during a
-- rollout: runtime/presence.py); empty for every other role.
INSERT INTO dispatcher_maintenance_leases AS l (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, now() + %(ttl_s)s * interval '1 second')
ON CONFLICT (name) DO UPDATE
   SET holder = excluded.holder, expires_at = excluded.expires_at
 WHERE l.holder = excluded.holder OR l.expires_at < now() OR l.holder = ANY(%(yielding)s::text[])
RETURNING l.holder

-- name: maintenance_lease_release
-- Give the role up (a worker shutting down), so another pod takes it at its next try rather than
-- when the lease runs out. Only our own row: a lease someone else took over is left alone.
DELETE FROM dispatcher_maintenance_leases WHERE name = %(name)s AND holder = %(holder)s
