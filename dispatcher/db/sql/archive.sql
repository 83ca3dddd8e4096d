-- The archive of completed jobs (migration 0020, docs/design/archive.md): how rows get there, and
-- the janitor's upkeep of its partitions.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code.

-- name: jobs_archive_insert
-- A fragment: the CTE that appends the rows a statement deleted from dispatcher_jobs ({moved}, a
-- CTE returning j.*) to the archive, completed. A row a completion deletes was running: it gets
-- its completion's time; one an older release marked completed (jobs_archive_completed) keeps its
-- own. Filled in by dispatcher/db/completions.py around the fenced DELETE, so the move is one
-- statement: a crash leaves the job either running (and reaped) or archived, never both or neither.
archived AS (
    INSERT INTO dispatcher_jobs_archive
           (id, queue_name, job_type, payload, status, priority, bucket, attempts, max_attempts, run_at,
            locked_at, locked_by, lock_token, lease_expires_at, completed_at, failed_at, last_error, dedupe_key,
            created_at, updated_at, lease_expiries, cancel_requested_at, ordering_key, ordering_halted,
            max_attempts_given, snoozes, dedupe_window_s, scheduled_for, trace_context, errors, depends_on,
            pending_parents, has_dependents, batch_id, result, awaited, progress, meta, tags)
    SELECT m.id, m.queue_name, m.job_type, m.payload, 'completed', m.priority, m.bucket, m.attempts,
           m.max_attempts, m.run_at, m.locked_at, m.locked_by, NULL, NULL, coalesce(m.completed_at, t.now),
           m.failed_at, m.last_error, m.dedupe_key, m.created_at, coalesce(m.completed_at, t.now),
           m.lease_expiries, m.cancel_requested_at, m.ordering_key, m.ordering_halted, m.max_attempts_given,
           m.snoozes, m.dedupe_window_s, m.scheduled_for, m.trace_context, m.errors, m.depends_on,
           m.pending_parents, m.has_dependents, m.batch_id, m.result, m.awaited, m.progress, m.meta, m.tags
      FROM {moved} AS m CROSS JOIN (SELECT now() AS now) AS t
)

-- name: jobs_archive_completed
-- Under DISPATCHER_COMPLETED_JOBS=archive, the janitor moves up to %(limit)s rows that are
-- `completed` in dispatcher_jobs to the archive, oldest first, whatever their age: rows an older
-- release completed by UPDATE during a rolling upgrade, or kept before the setting changed. One
-- range of dispatcher_jobs_completed_idx; SKIP LOCKED leaves a row an operator is acting on now. A
-- moved job with a uniqueness window leaves its finish time in it ({close_windows}), as a deleted
-- one does. Returns how many moved. {and_bucket}: as in jobs_prune_completed.
WITH gone AS (
    DELETE FROM dispatcher_jobs AS j
     WHERE j.id = ANY(ARRAY(
               SELECT c.id
                 FROM dispatcher_jobs AS c
                WHERE c.status = 'completed' {and_bucket}
                ORDER BY c.updated_at
                LIMIT %(limit)s
                  FOR UPDATE SKIP LOCKED)) {and_bucket}
    RETURNING j.*, j.updated_at AS finished_at
),
{archive_gone},
{close_windows}
SELECT count(*) FROM gone

-- name: archive_maintain
-- The janitor's upkeep of the archive's partitions (dispatcher_archive_maintain, migration 0020):
-- partitions of %(period_s)s seconds created up to %(ahead_s)s ahead, those wholly past
-- %(retention_s)s dropped (0: none), and up to %(limit)s default-partition rows past it deleted.
-- Returns how many partitions were created and dropped, default rows deleted, and the age in
-- seconds of the oldest upper bound or default row left (NULL: none).
SELECT created, dropped, default_deleted, oldest_age_s
  FROM dispatcher_archive_maintain(%(period_s)s::int, %(ahead_s)s::float8, %(retention_s)s::float8, %(limit)s::int)

-- name: archive_partitions
-- The archive's partitions, oldest first: name, bounds (NULL for the default one) and the
-- planner's row estimate, for `dispatcher status`, the janitor's lag and the tests.
SELECT c.relname,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$FROM \('([^']+)'\)$r$)::timestamptz AS from_at,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']+)'\)$r$)::timestamptz AS to_at,
       greatest(c.reltuples, 0)::bigint AS rows_estimate
  FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass
 ORDER BY 2 NULLS FIRST
