-- Every statement the dispatcher package runs, one per `-- name:` header.
-- Loaded by dispatcher/db/queries.py; code refers to them by name. Parameters use psycopg's
-- %(name)s style; {placeholders} in braces are filled in by code with validated integers only.

-- name: jobs_claim
-- Claim up to %(limit)s runnable jobs of one queue in ONE statement: select (by the mode's
-- {select_ids}, one of the claim_select_* fragments below), mark running, set owner, token and
-- lease, count the attempt, return the rows.
-- The WHERE re-checks status (and run_at: a job retried meanwhile is not due yet) on the row it
-- updates. The partitioned selections take no row locks, so if two owners overlap during a
-- hand-off (or a stealer takes rows of our buckets) the second waits for the first and then
-- skips the row: contention, never a double claim. The re-check is written as a CASE on purpose:
-- as plain `status = 'queued' AND run_at <= now()` it matches the partial indexes' predicate and
-- the planner walked (or bitmap-ANDed) a whole claim index of 500k rows instead of fetching the
-- selected ids by primary key. `id = ANY(ids)`, not `UPDATE ... FROM c`: the latter was planned
-- as a full scan of the table, at about half the throughput. tests/integration/test_claim.py
-- guards these plans on a fresh table.
-- Every row also carries how many ids the selection found (`selected`), and the statement
-- returns one row of NULLs with it when it claimed nothing: a claim that came back short only
-- because others took rows it had selected is not "our buckets ran dry". Without this, an owner
-- whose claim lost a few rows to a stealer at start-up slept a whole poll interval while a
-- stealer drained its buckets (spawn -> done 0.7x of SKIP LOCKED at 2 workers).
WITH picked AS MATERIALIZED (SELECT ARRAY({select_ids}) AS ids),
     claimed AS (
       UPDATE dispatcher_jobs
          SET status = 'running',
              attempts = attempts + 1,
              locked_at = now(),
              locked_by = %(worker)s,
              lock_token = %(token)s::uuid,
              lease_expires_at = now() + %(lease_s)s * interval '1 second',
              updated_at = now()
        WHERE id = ANY((SELECT ids FROM picked)::bigint[])  -- an array, not ANY(subquery)
          AND CASE WHEN status = 'queued' THEN run_at <= now() ELSE false END
       RETURNING id, job_type, payload, attempts, max_attempts, locked_at, bucket, priority)
SELECT c.id, c.job_type, c.payload, c.attempts, c.max_attempts, c.locked_at, c.bucket, c.priority,
       cardinality(p.ids) AS selected
  FROM picked AS p LEFT JOIN claimed AS c ON true

-- name: claim_select_partitioned
-- Partitioned mode: {bucket_branches} is one claim_select_partitioned_branch per owned bucket,
-- joined by UNION ALL. Each branch is an ordered walk of that bucket's index range and
-- PostgreSQL merges them (Merge Append) in (priority, run_at, id) order, so a claim of n jobs
-- reads about n + |buckets| index entries and nothing of other workers' buckets.
SELECT id FROM ({bucket_branches}) AS runnable
 ORDER BY priority, run_at, id
 LIMIT %(limit)s

-- name: claim_select_partitioned_branch
-- One owned bucket's runnable jobs in claim order (through dispatcher_jobs_claim_bucket_idx).
(SELECT id, priority, run_at
   FROM dispatcher_jobs
  WHERE queue_name = %(queue)s AND bucket = {bucket} AND status = 'queued' AND run_at <= now()
  ORDER BY priority, run_at, id
  LIMIT %(limit)s)

-- name: claim_select_all_buckets
-- Partitioned mode when this worker owns every bucket (a single worker): one walk of the
-- queue-wide index instead of a 64-branch Merge Append, whose executor start-up alone cost
-- ~2.5 ms per claim (5 us per job). Still no row locks.
SELECT id
  FROM dispatcher_jobs
 WHERE queue_name = %(queue)s AND status = 'queued' AND run_at <= now()
   AND priority > -32769  -- the tag of dispatcher_jobs_claim_idx's predicate (migration 0003)
 ORDER BY priority, run_at, id
 LIMIT %(limit)s

-- name: claim_select_steal
-- Stealing (partitioned mode, own buckets idle): walk OTHER workers' buckets in the given order
-- (the worker rotates it randomly), each through its own bucket-index range with SKIP LOCKED,
-- stopping as soon as %(limit)s rows are found. Not the queue-wide index: partitioned claims
-- never walk that one, so near the end of a drain every steal re-read its prefix of entries left
-- behind by processed jobs (~6,800 index entries per steal, 81 per job drained); each bucket's
-- range is kept clean by its owner's own claims, and the queue-wide index cannot serve this query
-- (its predicate's tag, migration 0003). FOR UPDATE is not allowed in UNION arms, hence LATERAL.
SELECT j.id
  FROM unnest(%(steal_buckets)s::smallint[]) AS s(bucket)
 CROSS JOIN LATERAL (
       SELECT id
         FROM dispatcher_jobs
        WHERE queue_name = %(queue)s AND bucket = s.bucket AND status = 'queued' AND run_at <= now()
        ORDER BY priority, run_at, id
        LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED) AS j
 LIMIT %(limit)s

-- name: claim_select_skip_locked
-- The classic claim: walk the queue's runnable rows in order, skipping rows other workers hold.
SELECT id
  FROM dispatcher_jobs
 WHERE queue_name = %(queue)s AND status = 'queued' AND run_at <= now()
   AND priority > -32769  -- the tag of dispatcher_jobs_claim_idx's predicate (migration 0003)
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED

-- name: jobs_complete_owned
-- Mark finished jobs completed, each only if it still carries the token of the claim that ran
-- it; rows whose lease was taken over are left alone (the caller counts them as fenced).
-- Shape, here and in the three statements below: `j.id = ANY(ids)` pins the jobs side to a
-- primary-key lookup of exactly the batch, and the ownership guard is a CASE so that no partial
-- index (`WHERE status = 'running'`) can match it. With a plain `status = 'running'`, stats
-- taken while every row was queued made the planner enter through the lease index and hash or
-- loop over every running row on each flush: 28k rows per flush, seconds per statement.
UPDATE dispatcher_jobs AS j
   SET status = 'completed',
       completed_at = now(),
       lock_token = NULL,
       lease_expires_at = NULL,
       updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS done(id, token)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = done.id
   AND CASE WHEN j.status = 'running' THEN j.lock_token = done.token ELSE false END

-- name: jobs_fail_owned
-- Record failed attempts, fenced by token like completions. Each row's status, delay and error
-- come from the retry policy (dispatcher/runtime/retry.py): 'queued' (retry after delay_s), 'failed'
-- (out of attempts, or no handler), 'discarded' (a permanent error) or 'cancelled' (an operator
-- asked). A retry of a job with a cancel request ends it 'cancelled' instead: a request that
-- came after the owner's last heartbeat is still honoured, and the job never runs again. The
-- reaper sends the same statement with %(lease_expired)s: then a row is written only if its
-- lease is still expired (a heartbeat that landed meanwhile wins) and its lease_expiries count
-- rises. Returns the rows written (with the status written), for the outcome lines (joblog.py:
-- run_at is when a retry is due, by the database's clock) and the reaper's history. Failures
-- are rare: completions return nothing.
UPDATE dispatcher_jobs AS j
   SET status = CASE WHEN f.status = 'queued' AND j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE f.status END,
       run_at = CASE WHEN f.status = 'queued' AND j.cancel_requested_at IS NULL
                     THEN now() + f.delay_s * interval '1 second' ELSE j.run_at END,
       failed_at = CASE WHEN f.status IN ('failed', 'discarded') THEN now() ELSE j.failed_at END,
       last_error = f.error,
       lease_expiries = j.lease_expiries + %(lease_expired)s::int,
       lock_token = NULL,
       lease_expires_at = NULL,
       updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(statuses)s::text[],
              %(delays_s)s::float8[], %(errors)s::text[]) AS f(id, token, status, delay_s, error)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id
   AND CASE WHEN j.status = 'running'
            THEN j.lock_token = f.token AND (NOT %(lease_expired)s OR j.lease_expires_at < now())
            ELSE false END
RETURNING j.id, j.status, j.attempts, j.locked_by, j.locked_at, j.run_at, j.job_type, j.queue_name, j.bucket,
          j.max_attempts

-- name: jobs_release_owned
-- Give claimed-but-unstarted jobs back at once (graceful shutdown): queued again, and the
-- attempt that never ran is not counted; 'cancelled' if an operator asked meanwhile.
UPDATE dispatcher_jobs AS j
   SET status = CASE WHEN j.cancel_requested_at IS NULL THEN 'queued' ELSE 'cancelled' END,
       attempts = greatest(j.attempts - 1, 0),
       lock_token = NULL,
       lease_expires_at = NULL,
       updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS r(id, token)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id
   AND CASE WHEN j.status = 'running' THEN j.lock_token = r.token ELSE false END

-- name: jobs_extend_leases
-- Heartbeat: push out the leases of jobs still running here. Returns the ids still owned, each
-- with whether an operator asked to cancel it (the owner then cancels its handler: how a cancel
-- request reaches a running job, with no statement of its own). A missing id means the reaper
-- (or another owner) took the job over.
UPDATE dispatcher_jobs AS j
   SET lease_expires_at = now() + %(lease_s)s * interval '1 second'
  FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS h(id, token)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = h.id
   AND CASE WHEN j.status = 'running' THEN j.lock_token = h.token ELSE false END
RETURNING j.id, j.cancel_requested_at IS NOT NULL

-- name: ping
-- The lease keeper's probe: does this connection still answer? (a stall raises no error)
SELECT 1;

-- name: jobs_lease_expired
-- Running jobs whose lease ran out (their worker died or stalled), oldest expiry first, with
-- what the retry policy needs (dispatcher/runtime/retry.py). No row locks: the write that follows
-- (jobs_fail_owned with lease_expired) is fenced by each job's token and re-checks the expiry,
-- so reapers in N pods, or an owner that comes back to life, never double-write a job. A job
-- with a cancel request is not retried: it ends 'cancelled'.
SELECT id, lock_token::text, attempts, max_attempts, lease_expiries + 1, locked_by, locked_at,
       cancel_requested_at IS NOT NULL
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
DELETE FROM dispatcher_jobs
 WHERE id = ANY(ARRAY(
           SELECT id
             FROM dispatcher_jobs
            WHERE status = 'completed' AND updated_at < now() - %(retention_s)s * interval '1 second'
            ORDER BY updated_at
            LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED))

-- name: jobs_prune_unsuccessful
-- The same for jobs that ended failed, discarded or cancelled, through
-- dispatcher_jobs_unsuccessful_idx (1,000 rows: 1.9 ms at 500k rows).
DELETE FROM dispatcher_jobs
 WHERE id = ANY(ARRAY(
           SELECT id
             FROM dispatcher_jobs
            WHERE status IN ('failed', 'discarded', 'cancelled')
              AND updated_at < now() - %(retention_s)s * interval '1 second'
            ORDER BY updated_at
            LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED))

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

-- Failed-job admin (dispatcher/api/admin.py, `dispatcher jobs ...`). Each statement runs in its own
-- short transaction with SET LOCAL statement_timeout (admin_statement_timeout), never prepared,
-- so it is planned with its parameters' values: a filter left out ({filters}: NULL) folds away
-- and a status filter can use the partial index of that status (queued: the claim indexes,
-- running: the lease index, completed / failed, discarded, cancelled: the indexes of migration
-- 0007, which are also ordered by age). Queue and job type are filters on those rows, with no
-- index of their own: an index on every row would cost every claim and completion a write.

-- name: admin_statement_timeout
SELECT set_config('statement_timeout', %(timeout)s, true)

-- name: admin_filters
-- The filters of every admin statement, on the row `j`; a NULL parameter means "any". The age is
-- by updated_at: the time a job entered its status (enqueued or retried, claimed, finished).
    (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
AND (%(queues)s::text[] IS NULL OR j.queue_name = ANY(%(queues)s::text[]))
AND (%(job_types)s::text[] IS NULL OR j.job_type = ANY(%(job_types)s::text[]))
AND (%(older_than_s)s::float8 IS NULL OR j.updated_at < now() - %(older_than_s)s::float8 * interval '1 second')
AND (%(newer_than_s)s::float8 IS NULL OR j.updated_at >= now() - %(newer_than_s)s::float8 * interval '1 second')
AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))

-- name: admin_jobs_list
-- Newest first (by id, the order of enqueueing): a walk of the primary key backwards that stops
-- at %(limit)s, or, for a status with few rows, that status's index and a sort.
SELECT j.id, j.queue_name, j.job_type, j.status, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
       j.updated_at, extract(epoch FROM now() - j.updated_at)::float8, j.locked_by, j.cancel_requested_at, j.last_error
  FROM dispatcher_jobs AS j
 WHERE {filters}
 ORDER BY j.id DESC
 LIMIT %(limit)s

-- name: admin_jobs_count
-- How many jobs match (what a bulk change would touch), and the newest id among them: a bulk
-- change goes up to that id, so jobs enqueued meanwhile are not swept in.
SELECT count(*), max(j.id) FROM dispatcher_jobs AS j WHERE {filters}

-- name: admin_jobs_page
-- The next batch of a bulk change: ids after %(after_id)s (keyset, so each batch is one short
-- range and the walk ends even if rows keep matching), up to %(max_id)s.
SELECT j.id
  FROM dispatcher_jobs AS j
 WHERE {filters} AND j.id > %(after_id)s AND j.id <= %(max_id)s
 ORDER BY j.id
 LIMIT %(limit)s

-- name: admin_job_show
SELECT id, queue_name, job_type, status, priority, bucket, attempts, max_attempts, lease_expiries, run_at,
       created_at, updated_at, locked_at, locked_by, lease_expires_at, completed_at, failed_at,
       cancel_requested_at, dedupe_key, payload, last_error
  FROM dispatcher_jobs
 WHERE id = %(id)s

-- name: admin_job_attempts
-- The job's attempt history (rows exist only with DISPATCHER_HISTORY on), through its index.
SELECT attempt, worker, started_at, finished_at, duration_ms, outcome, error
  FROM dispatcher_job_attempts
 WHERE job_id = %(id)s
 ORDER BY attempt, started_at
 LIMIT %(limit)s

-- name: admin_jobs_retry
-- Failed or discarded jobs among %(ids)s that still match the filters, back to queued, due now.
-- As River's JobRetry and Oban's retry_job: the attempt count stays (the history goes on) and
-- max_attempts rises to allow one more attempt if they were used up; last_error stays for
-- people, a stale cancel request goes. The status is re-checked on the row the UPDATE writes:
-- a job that changed meanwhile is skipped. A job whose dedupe key a live job holds now (or
-- another job of this batch, the lowest id of which goes) is skipped too: two live jobs may not
-- share a key. Shape, in the three statements of a change: the conditions sit in a CASE, so
-- that the rows are fetched by primary key (the batch) and not through a status index bitmap
-- ANDed with it (5 ms per batch at 100k failed rows, growing with them); the report comes back
-- as the changed rows, then every id with its row as it was before this statement (status,
-- whether the filters matched, whether its dedupe key was held), joined in admin.py: a join of
-- the two here was planned as a nested loop over the CTE (100 ms per 1,000 ids).
WITH changed AS (
    UPDATE dispatcher_jobs AS j
       SET status = 'queued',
           run_at = now(),
           max_attempts = greatest(j.max_attempts, j.attempts + 1),
           failed_at = NULL,
           cancel_requested_at = NULL,
           updated_at = now()
     WHERE j.id = ANY(%(ids)s::bigint[])
       AND CASE WHEN j.status IN ('failed', 'discarded') THEN {filters} AND (j.dedupe_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS d
                         WHERE d.queue_name = j.queue_name AND d.dedupe_key = j.dedupe_key
                           AND d.status IN ('queued', 'running'))
            AND j.id = (SELECT min(b.id) FROM dispatcher_jobs AS b
                         WHERE b.id = ANY(%(ids)s::bigint[]) AND b.queue_name = j.queue_name
                           AND b.dedupe_key = j.dedupe_key AND b.status IN ('failed', 'discarded'))))
            ELSE false END
    RETURNING j.id, j.status, j.queue_name, j.dedupe_key
)
SELECT id, NULL, NULL, status, NULL FROM changed
UNION ALL
SELECT t.id, j.status, coalesce({filters}, false), NULL,
       j.dedupe_key IS NOT NULL AND (
           EXISTS (SELECT 1 FROM dispatcher_jobs AS d  -- through dispatcher_jobs_dedupe_idx
                    WHERE d.queue_name = j.queue_name AND d.dedupe_key = j.dedupe_key
                      AND d.status IN ('queued', 'running'))
           OR EXISTS (SELECT 1 FROM changed AS c
                       WHERE c.queue_name = j.queue_name AND c.dedupe_key = j.dedupe_key AND c.id <> j.id))
  FROM unnest(%(ids)s::bigint[]) AS t(id)
  LEFT JOIN dispatcher_jobs AS j ON j.id = t.id

-- name: admin_jobs_cancel
-- Jobs among %(ids)s that still match the filters: a queued one (due or scheduled) becomes
-- 'cancelled' at once and never runs; a running one gets a cancel request (cancel_requested_at)
-- that its owner reads with its next heartbeat, and ends 'cancelled' (no retry). The status is
-- re-checked on the row written: a job claimed meanwhile gets the request instead, a job that
-- finished meanwhile is left alone. Same shape as admin_jobs_retry.
WITH changed AS (
    UPDATE dispatcher_jobs AS j
       SET status = CASE WHEN j.status = 'queued' THEN 'cancelled' ELSE j.status END,
           cancel_requested_at = coalesce(j.cancel_requested_at, now()),
           updated_at = CASE WHEN j.status = 'queued' THEN now() ELSE j.updated_at END
     WHERE j.id = ANY(%(ids)s::bigint[])
       AND CASE WHEN j.status IN ('queued', 'running') THEN {filters} ELSE false END
    RETURNING j.id, j.status
)
SELECT id, NULL, NULL, status, NULL FROM changed
UNION ALL
SELECT t.id, j.status, coalesce({filters}, false), NULL, false
  FROM unnest(%(ids)s::bigint[]) AS t(id)
  LEFT JOIN dispatcher_jobs AS j ON j.id = t.id

-- name: admin_jobs_purge
-- Delete finished jobs (completed, failed, discarded, cancelled) among %(ids)s that still match
-- the filters; live ones are never touched (re-checked on the row deleted). Their attempt
-- history stays until history_retention_s. Same shape as admin_jobs_retry.
WITH changed AS (
    DELETE FROM dispatcher_jobs AS j
     WHERE j.id = ANY(%(ids)s::bigint[])
       AND CASE WHEN j.status IN ('completed', 'failed', 'discarded', 'cancelled') THEN {filters} ELSE false END
    RETURNING j.id
)
SELECT id, NULL, NULL, 'purged', NULL FROM changed
UNION ALL
SELECT t.id, j.status, coalesce({filters}, false), NULL, false
  FROM unnest(%(ids)s::bigint[]) AS t(id)
  LEFT JOIN dispatcher_jobs AS j ON j.id = t.id

-- name: history_record
-- Execution history, one row per finished attempt (only when DISPATCHER_HISTORY is on). A NULL
-- duration means "until now" (a reaped attempt: its worker never reported back).
INSERT INTO dispatcher_job_attempts (job_id, attempt, worker, started_at, finished_at, duration_ms, outcome, error)
SELECT h.id, h.attempt, h.worker, h.started_at, now(),
       coalesce(h.duration_ms, extract(epoch FROM now() - h.started_at) * 1000), h.outcome, h.error
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(workers)s::text[], %(started_at)s::timestamptz[],
              %(durations_ms)s::float8[], %(outcomes)s::text[], %(errors)s::text[])
       AS h(id, attempt, worker, started_at, duration_ms, outcome, error)

-- name: jobs_insert_one
-- Enqueue one job and wake its bucket's owner, in one round trip. A live job with the same
-- (queue, dedupe_key) makes this a no-op: no row back, no notification.
-- A job not due yet appends ':<ms until run_at>' to the payload ('queue:bucket:1500'): its owner arms
-- its due timer instead of claiming now (producer.py). Measured from clock_timestamp(), so only the
-- time from this statement to COMMIT delays the wake-up. An immediate job's payload is unchanged, and
-- a worker of an older release parses 'queue:bucket:1500' as queue 'queue:bucket', which no queue
-- can be named (NAME_PATTERN has no ':'): it ignores it and polls the job up as before.
WITH inserted AS (
    INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, run_at, dedupe_key)
    VALUES (%(queue)s, %(job_type)s, %(payload)s, %(priority)s, %(bucket)s, %(max_attempts)s,
            coalesce(%(run_at)s::timestamptz, now()) + %(delay_s)s * interval '1 second', %(dedupe_key)s)
    ON CONFLICT (queue_name, dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
    RETURNING id, run_at
)
SELECT id, pg_notify(%(channel)s, %(notify)s || CASE WHEN due_in_ms > 0 THEN ':' || due_in_ms ELSE '' END)
  FROM (SELECT id, ceil(1000 * extract(epoch FROM run_at - clock_timestamp()))::bigint AS due_in_ms
          FROM inserted) AS i

-- name: jobs_copy_in
-- Bulk enqueue through COPY (text format, built by enqueue._copy_chunks). run_at is computed by the caller from the database's
-- now() read in the same transaction, so the database clock still rules.
COPY dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, run_at, dedupe_key)
FROM STDIN

-- name: jobs_stage_create
-- Bulk enqueue with dedupe keys: COPY into a temporary staging table first, because COPY
-- itself cannot skip conflicting rows.
CREATE TEMPORARY TABLE IF NOT EXISTS dispatcher_jobs_stage (
    queue_name text, job_type text, payload jsonb, priority smallint, bucket smallint,
    max_attempts integer, run_at timestamptz, dedupe_key text
) ON COMMIT DELETE ROWS

-- name: jobs_stage_copy_in
COPY dispatcher_jobs_stage (queue_name, job_type, payload, priority, bucket, max_attempts, run_at, dedupe_key)
FROM STDIN

-- name: jobs_stage_publish
-- Move staged rows into the jobs table, skipping live duplicates (also within the batch).
INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, run_at, dedupe_key)
SELECT queue_name, job_type, payload, priority, bucket, max_attempts, run_at, dedupe_key
  FROM dispatcher_jobs_stage
ON CONFLICT (queue_name, dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running')
DO NOTHING

-- name: jobs_stage_clear
TRUNCATE dispatcher_jobs_stage

-- name: jobs_reltuples
-- The planner's idea of the table's size (-1: never analyzed).
SELECT reltuples FROM pg_class WHERE oid = 'dispatcher_jobs'::regclass

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
                        ELSE 'before PostgreSQL 17 only the owner of the table or of the database may' END;
    END IF;
    IF pg_try_advisory_xact_lock(7022450131) AND EXISTS (
        SELECT 1 FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE c.oid = 'dispatcher_jobs'::regclass
           AND (c.reltuples < 0 OR s.n_live_tup > greatest(10000, c.reltuples * 2)))
    THEN
        ANALYZE dispatcher_jobs (queue_name, status, bucket, priority, run_at, lease_expires_at, completed_at, failed_at,
                                 updated_at);
    END IF;
END
$$

-- name: jobs_analyze
-- Only the columns plans depend on: statistics on the jsonb payload are the costly part of a
-- full ANALYZE (190 ms vs 130 ms per 200k rows) and no query filters on it.
ANALYZE dispatcher_jobs (queue_name, status, bucket, priority, run_at, lease_expires_at, completed_at, failed_at,
                         updated_at)

-- name: db_now
SELECT now()

-- name: jobs_next_due_in
-- Seconds (database clock) until the earliest queued job of one queue that is not due yet, in
-- %(buckets)s (NULL: any bucket); NULL if none. The producer asks after a poll, a due-timer or a bulk
-- wake-up or an assignment change, never per job: it finds jobs scheduled before the worker started,
-- in buckets it just gained, or whose NOTIFY was missed. Bounded: a loose index scan of
-- dispatcher_jobs_claim_idx, two descents per distinct priority, each then reading at most 256 future
-- entries in run_at order until one is in our buckets (uniform buckets: ~64/|buckets| entries). If none
-- of the 256 is ours, the 256th run_at is returned: ours are no earlier, so waking then and asking
-- again is never late.
WITH RECURSIVE priorities AS (
    (SELECT priority FROM dispatcher_jobs
      WHERE queue_name = %(queue)s AND status = 'queued' AND priority > -32769
      ORDER BY priority LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM dispatcher_jobs j
             WHERE j.queue_name = %(queue)s AND j.status = 'queued' AND j.priority > -32769
               AND j.priority > p.priority
             ORDER BY j.priority LIMIT 1)
      FROM priorities p
     WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min(next.run_at) - now())::float8
  FROM priorities p
 CROSS JOIN LATERAL (
    SELECT coalesce(
        (SELECT w.run_at
           FROM (SELECT j.run_at, j.bucket FROM dispatcher_jobs j
                  WHERE j.queue_name = %(queue)s AND j.status = 'queued' AND j.priority > -32769
                    AND j.priority = p.priority AND j.run_at > now()
                  ORDER BY j.run_at LIMIT 256) AS w
          WHERE %(buckets)s::smallint[] IS NULL OR w.bucket = ANY(%(buckets)s::smallint[])
          LIMIT 1),
        (SELECT j.run_at FROM dispatcher_jobs j
          WHERE j.queue_name = %(queue)s AND j.status = 'queued' AND j.priority > -32769
            AND j.priority = p.priority AND j.run_at > now()
          ORDER BY j.run_at OFFSET 255 LIMIT 1)) AS run_at
 ) AS next
 WHERE p.priority IS NOT NULL

-- name: notify_enqueued
-- Wake idle workers when the enqueuing transaction commits. One notification per enqueue call,
-- not per job; PostgreSQL folds identical notifications within a transaction.
SELECT pg_notify(%(channel)s, %(payload)s)

-- name: status_counts
SELECT queue_name, status, count(*) AS jobs
  FROM dispatcher_jobs
 GROUP BY queue_name, status
 ORDER BY queue_name, status

-- name: status_oldest_runnable
-- Age in seconds of the oldest job that is due and waiting, per queue.
SELECT queue_name, extract(epoch FROM now() - min(run_at))::float8 AS oldest_runnable_age_s
  FROM dispatcher_jobs
 WHERE status = 'queued' AND run_at <= now()
 GROUP BY queue_name
 ORDER BY queue_name

-- name: status_backlog_by_bucket
SELECT bucket, count(*) AS runnable
  FROM dispatcher_jobs
 WHERE status = 'queued' AND run_at <= now()
 GROUP BY bucket
 ORDER BY bucket

-- name: db_pressure
-- The database-side cost of the queue: dead tuples waiting for vacuum, index entries read by
-- claims (cumulative since the statistics were reset), sessions of OUR workers (application_name
-- dispatcher-claim, -complete, ...) waiting on a lock right now, and sessions of this database
-- busy running a statement (ours excluded: this one). pg_stat_activity shows a role the state of
-- its own sessions only, so a DML-only workers' role counts other roles' sessions as idle unless
-- it is granted pg_read_all_stats (README, Roles).
SELECT t.n_live_tup, t.n_dead_tup, t.seq_scan, t.idx_scan, t.n_tup_upd, t.n_tup_hot_upd,
       coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                  WHERE i.relid = t.relid
                    AND i.indexrelname IN ('dispatcher_jobs_claim_bucket_idx', 'dispatcher_jobs_claim_idx')), 0)::bigint
           AS claim_idx_tup_read,
       (SELECT count(*) FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
           AND starts_with(a.application_name, 'dispatcher-'))::bigint AS lock_waits,
       (SELECT count(*) FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.state = 'active' AND a.pid <> pg_backend_pid())::bigint
           AS active_sessions
  FROM pg_stat_user_tables t
 WHERE t.relname = 'dispatcher_jobs'

-- name: queue_depth
-- Jobs per queue in every status but completed (the table sampler, one pod at a time): queued
-- and due, scheduled (queued, run_at in the future), running, failed, discarded, cancelled; and
-- the age of the oldest due job per queue (0 when none is due). Each branch reads only its own
-- status's rows through a partial index. Completed rows are left out: they are kept for
-- completed_retention_s, so there are throughput x retention of them (3.6M at 1,000 jobs/s and
-- the 1 h default), and counting them every sample would cost more than the rest together;
-- completions are read as a rate of dispatcher_job_outcomes_total instead. A GROUP BY queue,
-- status over all rows took 180-310 ms per 1M rows here.
-- EXPLAIN ANALYZE on 1M rows (PostgreSQL 18, this 2-core machine, busy with other work):
-- - 10k queued, 20k failed, 970k finished: index-only scans of dispatcher_jobs_claim_bucket_idx
--   and dispatcher_jobs_failed_idx, 5-16 ms;
-- - 400k queued, 10k running, 50k failed: the planner reads the queued 40% of the table by a
--   parallel seq scan, the running by dispatcher_jobs_lease_idx, the failed by a bitmap scan of
--   dispatcher_jobs_failed_idx: 320-540 ms.
-- Bounded by the maintenance statement budget (store.SLOW_STATEMENT: 30 s at the defaults).
WITH queued AS (
    SELECT queue_name,
           count(*) FILTER (WHERE run_at <= now()) AS due,
           count(*) FILTER (WHERE run_at > now()) AS scheduled,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due
      FROM dispatcher_jobs
     WHERE status = 'queued'
     GROUP BY queue_name
)
SELECT q.queue_name, s.status, s.jobs, s.oldest_due_age_s
  FROM queued q
 CROSS JOIN LATERAL (VALUES ('queued', q.due, coalesce(extract(epoch FROM now() - q.oldest_due), 0)::float8),
                            ('scheduled', q.scheduled, NULL)) AS s(status, jobs, oldest_due_age_s)
UNION ALL
-- Separate branches, not `status IN ('running', 'failed')`: that is planned as a scan of the table.
SELECT queue_name, 'running', count(*), NULL FROM dispatcher_jobs WHERE status = 'running' GROUP BY queue_name
UNION ALL
SELECT queue_name, 'failed', count(*), NULL FROM dispatcher_jobs WHERE status = 'failed' GROUP BY queue_name
UNION ALL
-- Through dispatcher_jobs_unsuccessful_idx (migration 0007): rows kept for failed_retention_s.
-- The whole statement on 1M rows (10k queued, 20k failed, 4k discarded, 2k cancelled, the rest
-- completed), PostgreSQL 15 on this 2-core machine: 98-128 ms, each branch through its index.
SELECT queue_name, 'discarded', count(*), NULL FROM dispatcher_jobs WHERE status = 'discarded' GROUP BY queue_name
UNION ALL
SELECT queue_name, 'cancelled', count(*), NULL FROM dispatcher_jobs WHERE status = 'cancelled' GROUP BY queue_name

-- name: maintenance_lease_take
-- Take or renew the one-pod-at-a-time role %(name)s for %(ttl_s)s seconds, in ONE statement on
-- the database's clock: inserted if nobody ever held it; else taken over only if its lease ran
-- out, renewed only by its holder. A row back means we hold it. No session state (PgBouncer).
INSERT INTO dispatcher_maintenance_leases AS l (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, now() + %(ttl_s)s * interval '1 second')
ON CONFLICT (name) DO UPDATE
   SET holder = excluded.holder, expires_at = excluded.expires_at
 WHERE l.holder = excluded.holder OR l.expires_at < now()
RETURNING l.holder

-- name: maintenance_lease_release
-- Give the role up (a worker shutting down), so another pod takes it at its next try rather than
-- when the lease runs out. Only our own row: a lease someone else took over is left alone.
DELETE FROM dispatcher_maintenance_leases WHERE name = %(name)s AND holder = %(holder)s
