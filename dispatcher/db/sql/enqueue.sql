-- Enqueueing jobs (dispatcher/api/enqueue.py): one row, or many through COPY.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code
-- with validated integers only.

-- name: jobs_insert_one
-- Enqueue one job and wake its bucket's owner, in one round trip. A live job with the same
-- (queue, dedupe_key, bucket) makes this a no-op: no row back, no notification. The bucket is in
-- the dedupe index (migration 0014); enqueue places a job by its dedupe key unless another key
-- places it.
-- A job not due yet appends ':<ms until run_at>' to the payload ('queue:bucket:1500'): its owner arms
-- its due timer instead of claiming now (producer.py). Measured from clock_timestamp(), so only the
-- time from this statement to COMMIT delays the wake-up. An immediate job's payload is unchanged, and
-- a worker of an older release parses 'queue:bucket:1500' as queue 'queue:bucket', which no queue
-- can be named (NAME_PATTERN has no ':'): it ignores it and polls the job up as before.
-- %(tags)s: a text[] literal (db/literals.py tag_array), NULL for a job without tags.
WITH inserted AS (
    INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given,
                                 run_at, dedupe_key, dedupe_window_s, trace_context, tags)
    VALUES (%(queue)s, %(job_type)s, %(payload)s, %(priority)s, %(bucket)s, coalesce(%(max_attempts)s::int, 20),
            %(max_attempts)s::int IS NOT NULL,
            coalesce(%(run_at)s::timestamptz, now()) + %(delay_s)s * interval '1 second', %(dedupe_key)s,
            %(dedupe_window_s)s, %(trace_context)s::jsonb, %(tags)s::text[])
    ON CONFLICT DO NOTHING  -- only the live dedupe index can conflict; untargeted, as 0014 reshaped it
    RETURNING id, run_at
)
SELECT id, pg_notify(%(channel)s, %(notify)s || CASE WHEN due_in_ms > 0 THEN ':' || due_in_ms ELSE '' END)
  FROM (SELECT id, ceil(1000 * extract(epoch FROM run_at - clock_timestamp()))::bigint AS due_in_ms
          FROM inserted) AS i

-- name: jobs_copy_in
-- Bulk enqueue through COPY (text format, built by enqueue_copy.copy_chunks). run_at is computed by the caller from the database's
-- now() read in the same transaction, so the database clock still rules. tags: \N (NULL) for a job without.
COPY dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given, run_at,
                      dedupe_key, tags)
FROM STDIN

-- name: jobs_copy_in_traced
-- jobs_copy_in from inside an OpenTelemetry span: every row also carries that span's trace context.
COPY dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given, run_at,
                      dedupe_key, tags, trace_context)
FROM STDIN

-- name: jobs_stage_create
-- Bulk enqueue with dedupe or ordering keys: COPY into a temporary staging table first, because
-- COPY itself cannot skip conflicting rows or choose a keyed row's status. `n` keeps the order
-- the rows were given in; max_attempts is NULL where not given. The name carries the table's shape
-- (v2: dedupe_window_s; v3: tags): a pooled server connection may still hold one an older release created. A staged row with a dedupe window goes through sql/dedupe.sql too.
CREATE TEMPORARY TABLE IF NOT EXISTS dispatcher_jobs_stage_v3 (
    n bigint GENERATED ALWAYS AS IDENTITY,
    queue_name text, job_type text, payload jsonb, priority smallint, bucket smallint,
    max_attempts integer, run_at timestamptz, dedupe_key text, ordering_key text, dedupe_window_s double precision,
    tags text[]
) ON COMMIT DELETE ROWS

-- name: jobs_stage_copy_in
COPY dispatcher_jobs_stage_v3 (queue_name, job_type, payload, priority, bucket, max_attempts, run_at, dedupe_key,
                               ordering_key, dedupe_window_s, tags)
FROM STDIN

-- name: jobs_stage_publish
-- Move staged rows into the jobs table, skipping live duplicates (also within the batch). Every row
-- gets the enqueuing span's trace context (the trace_context parameter; NULL outside a span).
INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given,
                             run_at, dedupe_key, dedupe_window_s, trace_context, tags)
SELECT queue_name, job_type, payload, priority, bucket, coalesce(max_attempts, 20), max_attempts IS NOT NULL,
       run_at, dedupe_key, dedupe_window_s, %(trace_context)s::jsonb, tags
  FROM dispatcher_jobs_stage_v3
 ORDER BY n
ON CONFLICT DO NOTHING  -- only the live dedupe index can conflict; untargeted, as 0014 reshaped it

-- name: jobs_stage_clear
TRUNCATE dispatcher_jobs_stage_v3

-- name: jobs_reltuples
-- The planner's idea of the table's size (-1: never analyzed).
SELECT reltuples FROM pg_class WHERE oid = 'dispatcher_jobs'::regclass

-- name: jobs_analyze
-- Only the columns plans depend on: statistics on the jsonb payload are the costly part of a
-- full ANALYZE (190 ms vs 130 ms per 200k rows) and no query filters on it. `id` too: the primary
-- key is (id, bucket) (migration 0014), so only id's statistics tell the planner that each id of
-- `id = ANY(...)` is one row; without them it guesses, and may plan a batch's completion as a scan.
ANALYZE dispatcher_jobs (id, queue_name, status, bucket, priority, run_at, lease_expires_at, completed_at,
                         failed_at, updated_at)

-- name: db_now
SELECT now()

-- name: notify_enqueued
-- Wake idle workers when the enqueuing transaction commits. One notification per enqueue call,
-- not per job; PostgreSQL folds identical notifications within a transaction.
SELECT pg_notify(%(channel)s, %(payload)s)
