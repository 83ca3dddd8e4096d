-- Running jobs to their end (dispatcher/db/store.py): completions, failures, releases, lease
-- extensions, the lease keeper's probe and the attempt history.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code
-- with validated integers only.

-- name: jobs_complete_owned
-- Mark finished jobs completed, each only if it still carries the token of the claim that ran
-- it; rows whose lease was taken over are left alone (the caller counts them as fenced).
-- Shape, here and in the four statements below: `j.id = ANY(ids)` pins the jobs side to a
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

-- name: jobs_complete_owned_delete
-- DISPATCHER_COMPLETED_JOBS=delete: the same completion, but the finished rows are deleted, not
-- marked completed: no second row version, no completed-row index entry, and nothing for the
-- pruner or vacuum to clean up later. Fenced like jobs_complete_owned, by the same shape (read its
-- comment): a row whose token changed (reaped, claimed again) is left alone and counted as fenced
-- by the caller. The attempt history (DISPATCHER_HISTORY) is another table: it stays.
DELETE FROM dispatcher_jobs AS j
 USING unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS done(id, token)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = done.id
   AND CASE WHEN j.status = 'running' THEN j.lock_token = done.token ELSE false END

-- name: jobs_complete_owned_fenced
-- The completer's completion: jobs_complete_owned or jobs_complete_owned_delete (filled in as
-- {completion} by the store: the same fenced write, the same plan), answering which ids it
-- refused (fenced: their token changed). One array back per batch, empty in the common case:
-- only attempts whose write was accepted get a history row and an outcome count. Then the completed
-- jobs that have dependents (their children are released next: dispatcher/db/dependencies.py),
-- and a NOTIFY on %(results_channel)s for each one someone awaits (JobHandle.result); both empty,
-- and no NOTIFY sent, for jobs that use neither.
WITH done AS (
{completion}
    RETURNING j.id, j.has_dependents, j.awaited
)
SELECT ARRAY(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM done),
       ARRAY(SELECT id FROM done WHERE has_dependents),
       (SELECT count(pg_notify(%(results_channel)s, id || ':completed')) FROM done WHERE awaited)

-- name: jobs_fail_owned
-- Record failed attempts, fenced by token like completions. Each row's status, delay and error
-- come from the retry policy (dispatcher/runtime/retry.py): 'queued' (retry after delay_s), 'failed'
-- (out of attempts, or no handler), 'discarded' (a permanent error) or 'cancelled' (an operator
-- asked). A retry of a job with a cancel request ends it 'cancelled' instead: a request that
-- came after the owner's last heartbeat is still honoured, and the job never runs again. The
-- reaper sends the same statement with %(lease_expired)s: then a row is written only if its
-- lease is still expired (a heartbeat that landed meanwhile wins) and its lease_expiries count
-- rises. A keyed job that ends failed or discarded halts its key where %(halts)s says so (its
-- handler's on_ordered_failure): it stays the key's holder (ordering_halted). One that ends any
-- other way than a retry releases its key, whose next job is promoted ({promote_next}, see
-- ordering.sql).
-- A snooze (`raise Snooze(s)`: snooze_s not NULL) is queued again snooze_s from now, keeps its
-- key, and gives its attempt back, while the job has snoozed fewer than snooze_cap times
-- (DISPATCHER_MAX_SNOOZES); past that, the row's policy outcome (a failed attempt) is written
-- instead. Every snooze counts in `snoozes`, so `snoozed` below reads: this one was within the cap.
-- Returns the rows written (with the status written), for the outcome lines (joblog.py: run_at
-- is when a retry is due, by the database's clock), the history and the outcome counts.
-- Failures are rare: completions return nothing.
-- Every failed attempt but a snooze within its cap appends its error to `errors` (migration 0015):
-- the last %(errors_kept)s of them, each cut to %(error_chars)s characters (head and tail, around
-- ' [...] ': dispatcher/runtime/retry.py cut_error, which cut the error already). A
-- completion never touches the column: success pays nothing for it.
-- Every time is computed in `f`, outside the CASEs: Citus refuses a CASE that calls a function
-- which is not immutable (now(), timestamptz + interval, jsonb_build_object), so this text serves
-- both; the entry is built there and only its attempt number (an immutable cast) set in the CASE.
WITH written AS (
    UPDATE dispatcher_jobs AS j
       SET status = CASE WHEN (f.status = 'queued' OR (f.snooze_s IS NOT NULL AND j.snoozes < f.snooze_cap))
                              AND j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                         WHEN f.snooze_s IS NOT NULL AND j.snoozes < f.snooze_cap THEN 'queued'
                         ELSE f.status END,
           run_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.run_at
                         WHEN f.snooze_s IS NOT NULL AND j.snoozes < f.snooze_cap THEN f.snooze_at
                         WHEN f.status = 'queued' THEN f.retry_at
                         ELSE j.run_at END,
           failed_at = CASE WHEN f.status IN ('failed', 'discarded') AND NOT coalesce(j.snoozes < f.snooze_cap, false)
                            THEN f.now ELSE j.failed_at END,
           ordering_halted = j.ordering_key IS NOT NULL AND f.status IN ('failed', 'discarded') AND f.halts
                             AND NOT coalesce(j.snoozes < f.snooze_cap, false),
           last_error = CASE WHEN f.snooze_s IS NOT NULL AND j.snoozes < f.snooze_cap THEN j.last_error
                             ELSE f.error END,
           errors = CASE WHEN f.snooze_s IS NOT NULL AND j.snoozes < f.snooze_cap THEN j.errors
                         ELSE CASE WHEN jsonb_array_length(coalesce(j.errors, '[]')) >= %(errors_kept)s
                                   THEN j.errors - 0 ELSE coalesce(j.errors, '[]') END
                              || jsonb_set(f.error_entry, '{attempt}', j.attempts::text::jsonb) END,
           attempts = CASE WHEN f.snooze_s IS NOT NULL AND j.snoozes < f.snooze_cap AND j.cancel_requested_at IS NULL
                           THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
           snoozes = j.snoozes + (f.snooze_s IS NOT NULL)::int,
           lease_expiries = j.lease_expiries + %(lease_expired)s::int,
           lock_token = NULL,
           lease_expires_at = NULL,
           updated_at = now()
      FROM (SELECT u.*, now() AS now, now() + u.delay_s * interval '1 second' AS retry_at,
                   now() + u.snooze_s * interval '1 second' AS snooze_at,
                   jsonb_build_object('attempt', 0, 'at', now(), 'error',
                                      CASE WHEN length(u.error) <= %(error_chars)s THEN u.error
                                           ELSE left(u.error, (%(error_chars)s - 7) / 2) || ' [...] '
                                                || right(u.error, %(error_chars)s - 7 - (%(error_chars)s - 7) / 2) END)
                       AS error_entry
              FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(statuses)s::text[],
                          %(delays_s)s::float8[], %(errors)s::text[], %(halts)s::bool[],
                          %(snoozes_s)s::float8[], %(snooze_caps)s::int[])
                   AS u(id, token, status, delay_s, error, halts, snooze_s, snooze_cap)) AS f
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id
       AND CASE WHEN j.status = 'running'
                THEN j.lock_token = f.token AND (NOT %(lease_expired)s OR j.lease_expires_at < f.now)
                ELSE false END
    RETURNING j.id, j.status, j.attempts, j.locked_by, j.locked_at, j.run_at, j.job_type, j.queue_name, j.bucket,
              CASE WHEN j.max_attempts_given THEN j.max_attempts END AS max_attempts, j.ordering_key, j.ordering_halted,
              f.snooze_s IS NOT NULL AND j.snoozes <= f.snooze_cap AND j.status = 'queued' AS snoozed,
              j.has_dependents AND j.status IN ('failed', 'discarded', 'cancelled') AS releases, j.awaited
),
-- Anyone awaiting a job that ended here (JobHandle.result) is told; a retry ends nothing.
told AS (
    SELECT count(pg_notify(%(results_channel)s, id || ':' || status)) AS told
      FROM written WHERE awaited AND status IN ('failed', 'discarded', 'cancelled')
),
released AS (
    SELECT queue_name, ordering_key FROM written
     WHERE ordering_key IS NOT NULL AND status <> 'queued' AND NOT ordering_halted
),
{promote_next}
SELECT w.id, w.status, w.attempts, w.locked_by, w.locked_at, w.run_at, w.job_type, w.queue_name, w.bucket,
       w.max_attempts, w.ordering_halted, w.snoozed, coalesce(w.releases, false)
  FROM written AS w CROSS JOIN woken CROSS JOIN told

-- name: jobs_release_owned
-- Give claimed-but-unstarted jobs back at once (graceful shutdown): queued again, and the
-- attempt that never ran is not counted; 'cancelled' if an operator asked meanwhile (a keyed one
-- then releases its key: {promote_next}). Returns how many were given back.
WITH written AS (
    UPDATE dispatcher_jobs AS j
       SET status = CASE WHEN j.cancel_requested_at IS NULL THEN 'queued' ELSE 'cancelled' END,
           attempts = greatest(j.attempts - 1, 0),
           lock_token = NULL,
           lease_expires_at = NULL,
           updated_at = now()
      FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS r(id, token)
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id
       AND CASE WHEN j.status = 'running' THEN j.lock_token = r.token ELSE false END
    RETURNING j.status, j.queue_name, j.ordering_key
),
released AS (SELECT queue_name, ordering_key FROM written WHERE status = 'cancelled'),
{promote_next}
SELECT (SELECT count(*) FROM written), (SELECT promoted FROM woken)

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

-- name: history_record
-- Execution history, one row per finished attempt (only when DISPATCHER_HISTORY is on). A NULL
-- duration means "until now" (a reaped attempt: its worker never reported back).
INSERT INTO dispatcher_job_attempts (job_id, attempt, worker, started_at, finished_at, duration_ms, outcome, error)
SELECT h.id, h.attempt, h.worker, h.started_at, now(),
       coalesce(h.duration_ms, extract(epoch FROM now() - h.started_at) * 1000), h.outcome, h.error
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(workers)s::text[], %(started_at)s::timestamptz[],
              %(durations_ms)s::float8[], %(outcomes)s::text[], %(errors)s::text[])
       AS h(id, attempt, worker, started_at, duration_ms, outcome, error)

-- name: jobs_hand_back_owned
-- Jobs whose type has no handler in the worker that claimed them: during a rollout that adds a job
-- type, an older pod claims the newer type's jobs (dispatcher/db/handbacks.py). Each is queued
-- again %(delays_s)s from now with its attempt given back and its ordering key kept (a keyed job
-- stays its key's holder: nothing halts, nothing passes it), or 'cancelled' if an operator asked
-- meanwhile. Where the worker found that no worker has served the type within the last
-- %(window_s)s seconds (%(unserved)s) and the job is older than that, it is discarded instead, with
-- %(errors)s as its last error, and its key is released: a type nobody serves any more does not
-- hold a key for ever. Fenced by token like every owner's write; times computed in `f`, outside
-- the CASEs (Citus: see jobs_fail_owned). Returns each row written, with the status written.
WITH written AS (
    UPDATE dispatcher_jobs AS j
       SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                         WHEN f.unserved AND j.created_at < f.discard_before THEN 'discarded'
                         ELSE 'queued' END,
           run_at = CASE WHEN j.cancel_requested_at IS NULL AND NOT (f.unserved AND j.created_at < f.discard_before)
                         THEN f.retry_at ELSE j.run_at END,
           failed_at = CASE WHEN j.cancel_requested_at IS NULL AND f.unserved AND j.created_at < f.discard_before
                            THEN f.now ELSE j.failed_at END,
           last_error = CASE WHEN j.cancel_requested_at IS NULL AND f.unserved AND j.created_at < f.discard_before
                             THEN f.error ELSE j.last_error END,
           attempts = greatest(j.attempts - 1, 0),
           lock_token = NULL,
           lease_expires_at = NULL,
           updated_at = now()
      FROM (SELECT u.*, now() AS now, now() + u.delay_s * interval '1 second' AS retry_at,
                   now() - %(window_s)s * interval '1 second' AS discard_before
              FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(delays_s)s::float8[], %(unserved)s::bool[],
                          %(errors)s::text[]) AS u(id, token, delay_s, unserved, error)) AS f
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id
       AND CASE WHEN j.status = 'running' THEN j.lock_token = f.token ELSE false END
    RETURNING j.id, j.status, j.queue_name, j.job_type, j.ordering_key
),
released AS (SELECT queue_name, ordering_key FROM written WHERE ordering_key IS NOT NULL AND status <> 'queued'),
{promote_next}
SELECT w.id, w.status, w.queue_name, w.job_type, (SELECT promoted FROM woken) AS promoted
  FROM written AS w
