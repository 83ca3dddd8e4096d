-- The worker registry (migration 0016, dispatcher/runtime/presence.py): each worker's heartbeat,
-- its leaving, and what the fleet reads of it.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style.

-- name: presence_beat
-- A worker's heartbeat: its row written (inserted at its first beat), live for %(lease_s)s more
-- seconds of the database clock. Returns when it started, by that clock: its process's first beat
-- (%(first)s), even where a fixed worker id (a pod's name) finds the row of an earlier process.
INSERT INTO dispatcher_workers AS w (worker_id, host, pid, version, mode, coordinator, queues, job_types,
                                     schedules, concurrency, running, expires_at)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(version)s, %(mode)s, %(coordinator)s, %(queues)s::text[],
        %(job_types)s::text[], %(schedules)s, %(concurrency)s, %(running)s,
        now() + %(lease_s)s * interval '1 second')
ON CONFLICT (worker_id) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, version = excluded.version, mode = excluded.mode,
       coordinator = excluded.coordinator, queues = excluded.queues, job_types = excluded.job_types,
       schedules = excluded.schedules, concurrency = excluded.concurrency, running = excluded.running,
       started_at = CASE WHEN %(first)s THEN now() ELSE w.started_at END,
       seen_at = now(), expires_at = excluded.expires_at, stopped_at = NULL
RETURNING w.started_at

-- name: presence_leave
-- A clean stop: out of the live view at once. The row stays, for the types it served lately.
UPDATE dispatcher_workers SET stopped_at = now(), expires_at = now(), running = 0
 WHERE worker_id = %(worker_id)s

-- name: presence_lately
-- The workers seen within %(window_s)s seconds, live or not: which job types were served lately,
-- and which schedules the live ones declare (a handful of rows).
SELECT worker_id, started_at, queues, job_types, schedules, expires_at > now() AND stopped_at IS NULL AS live
  FROM dispatcher_workers
 WHERE seen_at > now() - %(window_s)s * interval '1 second'

-- name: presence_prune
-- Rows of workers not seen for %(window_s)s seconds: they tell nothing more.
DELETE FROM dispatcher_workers WHERE seen_at < now() - %(window_s)s * interval '1 second'

-- name: presence_list
-- The registry as `dispatcher status` and the dashboard show it: every row, live ones first, with
-- ages by the database clock.
SELECT worker_id, host, pid, version, mode, coordinator, queues, job_types, concurrency, running,
       started_at, extract(epoch FROM now() - seen_at)::float8 AS seen_age_s,
       extract(epoch FROM now() - started_at)::float8 AS up_s,
       expires_at > now() AND stopped_at IS NULL AS live, stopped_at
  FROM dispatcher_workers
 ORDER BY expires_at > now() AND stopped_at IS NULL DESC, started_at, worker_id

-- name: presence_served_pairs
-- Every (queue, job type) a live worker serves: what `dispatcher status` and the dashboard compare
-- the jobs with (dispatcher/api/unserved_types.py).
SELECT DISTINCT q.queue_name, t.job_type
  FROM dispatcher_workers AS w
 CROSS JOIN LATERAL unnest(w.queues) AS q(queue_name)
 CROSS JOIN LATERAL unnest(w.job_types) AS t(job_type)
 WHERE w.expires_at > now() AND w.stopped_at IS NULL

-- name: jobs_waiting_or_discarded_by_type
-- Queued jobs, and jobs discarded because no worker served their type (jobs_hand_back_owned's
-- last_error), per queue and type: one pass over those rows, for status and the dashboard.
SELECT queue_name, job_type, count(*) FILTER (WHERE status = 'queued') AS waiting,
       count(*) FILTER (WHERE status = 'discarded' AND starts_with(last_error, %(discarded_prefix)s)) AS discarded
  FROM dispatcher_jobs
 WHERE status IN ('queued', 'discarded')
 GROUP BY queue_name, job_type
