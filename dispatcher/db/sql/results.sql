-- Results: what handlers return, stored with their jobs, and the reads of those who await them
-- (dispatcher/api/results.py, dispatcher/db/store.py). Jobs that return nothing never run these.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style.

-- name: jobs_results_write
-- The return values of jobs about to be completed, each written only while the job still runs
-- under the claim's token (the fence of every owner's write, in the CASE shape of finish.sql). The
-- completion that follows, in the store's next statement, is the one that ends them: until it
-- lands a result is stored but nobody reads it (readers wait for the job's end). A value that
-- could not be stored (runtime/results.py) leaves the result NULL and says why in last_error.
UPDATE dispatcher_jobs AS j
   SET result = r.result::jsonb,
       last_error = coalesce(r.error, j.last_error)
  FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::text[], %(errors)s::text[])
       AS r(id, token, result, error)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id
   AND CASE WHEN j.status = 'running' THEN j.lock_token = r.token ELSE false END

-- name: job_result_watch
-- Someone awaits the job's end (JobHandle.result): from now on, the statement that ends it sends a
-- NOTIFY (finish.sql, deps.sql). Marked under the row's lock, so an end that commits after this
-- reads the mark; one that committed before is read here. Its status, result and last error now;
-- no row if there is no such row (or it moved to the archive meanwhile: the wait reads it there).
UPDATE dispatcher_jobs
   SET awaited = true
 WHERE id = %(id)s
RETURNING status, result, last_error

-- name: job_result_read
-- The job's status, result and last error now (an awaited job's end was told, or the wait polls),
-- from the jobs table or, completed, the archive (migration 0020); no row if its row is gone
-- (deleted by its completion, or purged, or past retention).
SELECT status, result, last_error FROM dispatcher_jobs WHERE id = %(id)s
UNION ALL
SELECT status, result, last_error FROM dispatcher_jobs_archive WHERE id = %(id)s
LIMIT 1

-- name: results_listen
-- A wait's subscription to the ends of awaited jobs: the channel is RESULTS_CHANNEL
-- (dispatcher/constants.py), to which the statements that end jobs send '<id>:<status>'.
LISTEN dispatcher_results

-- name: results_unlisten
UNLISTEN dispatcher_results
