-- What running handlers report (Job.set_progress, Job.update_meta): written by the worker's
-- progress flusher in one batch (dispatcher/runtime/progress.py, dispatcher/db/progress.py).

-- name: jobs_report_progress
-- Each job's latest progress (replaces the column; NULL: none reported since the last write) and
-- its metadata updates (merged into `meta` key by key with ||; NULL: none), where the job still
-- runs under the reporting claim's token: a job reaped, finished or claimed again meanwhile keeps
-- what it has, like every other owner write (jobs_extend_leases). updated_at stays: it says when
-- the job entered its status. A merge that would make the stored meta longer than
-- %(meta_bytes)s as text is not made (the progress still is); `meta_refused` says so, measured
-- on the row as written (a merge is idempotent: made, merging again changes nothing). The JSON
-- arrives as text and is cast in the FROM list, so that on a Citus cluster the SET holds only
-- immutable operators on the row (per bucket there: dispatcher/db/sharded.py's `pinned`).
UPDATE dispatcher_jobs AS j
   SET progress = coalesce(p.progress, j.progress),
       meta = CASE WHEN p.meta IS NULL THEN j.meta
                   WHEN octet_length((coalesce(j.meta, '{}'::jsonb) || p.meta)::text) > %(meta_bytes)s THEN j.meta
                   ELSE coalesce(j.meta, '{}'::jsonb) || p.meta END
  FROM (SELECT r.id, r.token, r.progress::jsonb AS progress, r.meta::jsonb AS meta
          FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(progress)s::text[], %(meta)s::text[])
               AS r(id, token, progress, meta)) AS p
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = p.id
   AND CASE WHEN j.status = 'running' THEN j.lock_token = p.token ELSE false END
RETURNING j.id,
          p.meta IS NOT NULL
          AND octet_length((coalesce(j.meta, '{}'::jsonb) || p.meta)::text) > %(meta_bytes)s AS meta_refused
