-- The statements a worker runs when the jobs table is distributed by bucket over a Citus cluster
-- (dispatcher/db/sharded.py; docs/concepts/citus.md). Each names exactly one bucket, so Citus
-- routes it whole to the one node that holds that bucket's shard: no cross-node locks, no
-- two-phase commit. The writes (completion, failure, release, lease extension) are the
-- single-node texts with the bucket pinned (sharded.py); the statements below are the ones whose
-- single-node shape spans buckets. Citus refuses a function that is not immutable inside a CASE
-- or a RETURNING list of a write, hence the computed columns outside them.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder.

-- name: jobs_claim_bucket
-- jobs_claim for one bucket, %(bucket)s: select in claim order (dispatcher_jobs_claim_bucket_idx),
-- mark running under a new token and lease, return the rows. {lock} is empty in partitioned mode
-- (the owner takes no row locks, as on one node) and FOR UPDATE SKIP LOCKED in skip_locked mode,
-- which Citus accepts for a query on one shard. The UPDATE re-checks status and due time on the
-- row it writes; the coalesce keeps that re-check from matching a partial index's predicate (see
-- jobs_claim). `selected` is NULL when the flow-control version changed (nothing claimed).
WITH picked AS MATERIALIZED (
    SELECT id
      FROM dispatcher_jobs
     WHERE queue_name = %(queue)s AND bucket = %(bucket)s::smallint AND status = 'queued' AND run_at <= now()
       {type_filter}
       AND (%(flow_version)s::bigint IS NULL
            OR %(flow_version)s::bigint = (SELECT coalesce(max(version), 0) FROM dispatcher_flow_control))
     ORDER BY priority, run_at, id
     LIMIT %(limit)s
       {lock}
),
claimed AS (
    UPDATE dispatcher_jobs
       SET {mark_running}
     WHERE bucket = %(bucket)s::smallint AND id IN (SELECT id FROM picked)
       AND coalesce(status = 'queued', false) AND run_at <= now()
    RETURNING id, job_type, payload, attempts, max_attempts_given, max_attempts, locked_at, run_at,
              bucket, priority, ordering_key, scheduled_for, trace_context
)
SELECT c.id, c.job_type, c.payload, c.attempts, CASE WHEN c.max_attempts_given THEN c.max_attempts END,
       extract(epoch FROM c.locked_at)::float8, c.bucket, c.priority, c.ordering_key,
       p.selected, c.scheduled_for, date_part('epoch', c.locked_at - c.run_at), c.trace_context
  FROM (SELECT CASE WHEN %(flow_version)s::bigint IS NULL
                      OR %(flow_version)s::bigint = (SELECT coalesce(max(version), 0) FROM dispatcher_flow_control)
                    THEN (SELECT count(*) FROM picked) END AS selected) AS p
  LEFT JOIN claimed AS c ON true

-- name: jobs_next_due_in_bucket
-- jobs_next_due_in for one bucket: seconds until its earliest queued job that is not due yet, or
-- NULL. A loose index scan of the bucket's range of dispatcher_jobs_claim_bucket_idx: one descent
-- per distinct priority, then the first future run_at within it.
WITH RECURSIVE priorities AS (
    (SELECT priority FROM dispatcher_jobs
      WHERE queue_name = %(queue)s AND bucket = %(bucket)s::smallint AND status = 'queued'
      ORDER BY priority LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM dispatcher_jobs j
             WHERE j.queue_name = %(queue)s AND j.bucket = %(bucket)s::smallint AND j.status = 'queued'
               AND j.priority > p.priority
             ORDER BY j.priority LIMIT 1)
      FROM priorities p
     WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min(next.run_at) - now())::float8
  FROM priorities p
 CROSS JOIN LATERAL (
    SELECT j.run_at FROM dispatcher_jobs j
     WHERE j.queue_name = %(queue)s AND j.bucket = %(bucket)s::smallint AND j.status = 'queued'
       AND j.priority = p.priority AND j.run_at > now()
     ORDER BY j.run_at LIMIT 1) AS next
 WHERE p.priority IS NOT NULL

-- name: jobs_lease_expired_bucket
-- jobs_lease_expired for one bucket (the reaper visits every bucket in turn).
SELECT id, lock_token::text, attempts, CASE WHEN max_attempts_given THEN max_attempts END, lease_expiries + 1,
       locked_by, locked_at,
       cancel_requested_at IS NOT NULL, job_type, ordering_key IS NOT NULL, bucket
  FROM dispatcher_jobs
 WHERE bucket = %(bucket)s::smallint AND status = 'running' AND lease_expires_at < now()
 ORDER BY lease_expires_at
 LIMIT %(limit)s

-- name: sharded_promote_next
-- ordering_promote_next on a distributed table, in place of it in the pinned writes (sharded.py):
-- each released key's next waiting job becomes queued, in the one bucket the statement names (a
-- key's jobs all share the bucket its key picks). No NOTIFY here: inside a routed statement it
-- would be sent on the worker node, where no worker listens; the store wakes the bucket's owner
-- from the coordinator node instead when `promoted` says there were any. Defines `promoted` and
-- `woken` as ordering_promote_next does.
nexts AS MATERIALIZED (
    SELECT nxt.id
      FROM (SELECT DISTINCT r.queue_name, r.ordering_key FROM released AS r WHERE r.ordering_key IS NOT NULL) AS k
     CROSS JOIN LATERAL (
           SELECT n.id
             FROM dispatcher_jobs AS n  -- dispatcher_jobs_ordering_waiting_idx
            WHERE n.bucket = %(bucket)s::smallint AND n.queue_name = k.queue_name
              AND n.ordering_key = k.ordering_key AND n.status = 'waiting'
            ORDER BY n.id
            LIMIT 1) AS nxt
),
promoted AS (
    UPDATE dispatcher_jobs AS w
       SET status = 'queued',
           updated_at = now()
     WHERE w.bucket = %(bucket)s::smallint AND w.id = ANY(ARRAY(SELECT id FROM nexts))
       AND CASE WHEN w.status = 'waiting' THEN true ELSE false END
    RETURNING w.queue_name
),
woken AS (SELECT (SELECT count(*) FROM promoted) AS promoted)

-- name: sharded_wake
-- Wake the owners of one bucket of some queues after a routed statement promoted jobs there (the
-- payload is jobs_insert_one's: queue:bucket). Sent on the coordinator node, where workers listen.
SELECT count(pg_notify(%(channel)s, q || ':' || %(bucket)s::text)) FROM unnest(%(queues)s::text[]) AS q

-- name: jobs_complete_keyed_bucket
-- The keyed completion (jobs_complete_owned_keyed) for one bucket: complete the jobs, promote each
-- released key's next job. It claims no next job for the worker (no chain): the promoted job is
-- claimed like any other. Returns how many were completed, promoted, and the ids refused.
-- Then the jobs it finished that have a uniqueness window: under DISPATCHER_COMPLETED_JOBS=delete
-- the store closes their windows next (sharded_windows_close). Last, those that have dependents,
-- whose children the store releases next (dispatcher/db/dependencies.py).
WITH released AS (
{completion}
    RETURNING j.id, j.queue_name, j.ordering_key, j.dedupe_window_s, j.has_dependents
),
{promote}
SELECT (SELECT count(*) FROM released), w.promoted,
       ARRAY(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM released),
       ARRAY(SELECT DISTINCT queue_name FROM released),
       ARRAY(SELECT id FROM released WHERE dedupe_window_s IS NOT NULL),
       ARRAY(SELECT id FROM released WHERE has_dependents)
  FROM woken AS w

-- name: sharded_complete_fenced
-- jobs_complete_owned_fenced for one bucket, also answering which finished jobs have a uniqueness
-- window: on one node the delete closes them in the same statement (jobs_complete_owned_delete_fenced),
-- but Citus routes a statement to the shard's node, and the windows live on the coordinator node.
-- Last, the finished jobs that have dependents (released next, as on one node). Anyone awaiting a
-- job here learns of its end by polling: a NOTIFY sent on the shard's node reaches no listener.
WITH done AS (
{completion}
    RETURNING j.id, j.dedupe_window_s, j.has_dependents
)
SELECT ARRAY(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM done),
       ARRAY(SELECT id FROM done WHERE dedupe_window_s IS NOT NULL),
       ARRAY(SELECT id FROM done WHERE has_dependents)

-- name: sharded_windows_close
-- Under DISPATCHER_COMPLETED_JOBS=delete: the windows of %(ids)s, jobs a completion just deleted,
-- end their job's run now. A separate statement, after the delete committed: a crash between the
-- two leaves the window counting from its enqueue (dedupe_window_until), never a live job
-- unguarded.
UPDATE dispatcher_dedupe_windows AS w
   SET finished_at = now(),
       prune_after = now() + w.window_s * interval '1 second'
 WHERE w.job_id = ANY(%(ids)s::bigint[])

-- name: ordering_promote_scan_bucket
-- ordering_promote_scan for one bucket (the sweeper visits them in turn): keys of `queue` in
-- %(bucket)s with waiting jobs and no holder, after %(after)s in key order, up to %(limit)s.
WITH RECURSIVE scan AS (
    (SELECT w.ordering_key FROM dispatcher_jobs AS w
      WHERE w.bucket = %(bucket)s::smallint AND w.queue_name = %(queue)s AND w.status = 'waiting'
        AND w.ordering_key > %(after)s
      ORDER BY w.ordering_key LIMIT 1)
    UNION ALL
    SELECT (SELECT w.ordering_key FROM dispatcher_jobs AS w
             WHERE w.bucket = %(bucket)s::smallint AND w.queue_name = %(queue)s AND w.status = 'waiting'
               AND w.ordering_key > s.ordering_key
             ORDER BY w.ordering_key LIMIT 1)
      FROM scan AS s
     WHERE s.ordering_key IS NOT NULL
),
scanned AS (SELECT ordering_key FROM scan WHERE ordering_key IS NOT NULL LIMIT %(limit)s),
released AS (
    SELECT %(queue)s::text AS queue_name, k.ordering_key
      FROM scanned AS k
     WHERE NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS h  -- dispatcher_jobs_ordering_holder_idx
                        WHERE h.bucket = %(bucket)s::smallint AND h.queue_name = %(queue)s
                          AND h.ordering_key = k.ordering_key
                          AND (h.status IN ('queued', 'running') OR h.ordering_halted))
),
{promote}
SELECT CASE WHEN (SELECT count(*) FROM scanned) >= %(limit)s THEN (SELECT max(ordering_key) FROM scanned) END,
       (SELECT count(*) FROM scanned), (SELECT promoted FROM woken)

-- name: sharded_running_by_type
-- flow_gate_running on a distributed table: the running jobs of every shard counted per type and
-- queue in one fan-out (through dispatcher_jobs_lease_idx on each shard); the store adds them up
-- per limit row. Bounded by what runs: the fleet's concurrency.
SELECT job_type, queue_name, count(*)::int
  FROM dispatcher_jobs
 WHERE status = 'running' AND lease_expires_at IS NOT NULL
 GROUP BY job_type, queue_name

-- name: sharded_buckets_of
-- The bucket of each of %(ids)s that exists, for a caller that did not give them (the worker always
-- does): a fan-out over every shard, by primary key in each.
SELECT id, bucket FROM dispatcher_jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: sharded_admin_buckets_of
-- sharded_buckets_of for an operator's change, which may reach archived jobs too (a purge): the
-- bucket of each of %(ids)s in the jobs table or the archive of completed jobs.
SELECT id, bucket FROM dispatcher_jobs WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, bucket FROM dispatcher_jobs_archive WHERE id = ANY(%(ids)s::bigint[])

-- name: sharded_promote_keys
-- ordering_promote_keys on a distributed table, for the keys of one bucket (%(bucket)s: that of
-- the jobs whose change released them, a key's jobs all sharing it). Citus refuses the
-- single-node text's subquery correlated with unnest(); this one is not correlated. Returns how
-- many were promoted and their queues: the caller wakes the bucket's owners (sharded_wake).
WITH released AS (
    SELECT DISTINCT k.queue_name, k.ordering_key
      FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS k(queue_name, ordering_key)
     WHERE (k.queue_name, k.ordering_key) NOT IN (
           SELECT h.queue_name, h.ordering_key
             FROM dispatcher_jobs AS h  -- dispatcher_jobs_ordering_holder_idx
            WHERE h.bucket = %(bucket)s::smallint AND h.ordering_key = ANY(%(keys)s::text[])
              AND (h.status IN ('queued', 'running') OR h.ordering_halted))
),
{sharded_promote_next}
SELECT (SELECT promoted FROM woken), ARRAY(SELECT DISTINCT queue_name FROM promoted)

-- name: sharded_queue_names_in_bucket
-- web_queue_names' skip scan of the queued jobs, in one bucket (%(bucket)s): Citus takes a
-- recursive CTE only with a filter on the distribution column. The dashboard runs it for each
-- bucket of a distributed table (dispatcher/web/reads.py), then sharded_owned_queues.
WITH RECURSIVE queued(queue_name) AS (
    (SELECT queue_name FROM dispatcher_jobs
      WHERE bucket = %(bucket)s::smallint AND status = 'queued' AND priority > -32769
      ORDER BY queue_name LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue_name FROM dispatcher_jobs AS j
             WHERE j.bucket = %(bucket)s::smallint AND j.status = 'queued' AND j.priority > -32769
               AND j.queue_name > q.queue_name
             ORDER BY j.queue_name LIMIT 1)
      FROM queued AS q
     WHERE q.queue_name IS NOT NULL
)
SELECT queue_name FROM queued WHERE queue_name IS NOT NULL

-- name: sharded_owned_queues
-- The queues with a coordination group (web_queue_names' second half).
SELECT DISTINCT queue FROM dispatcher_bucket_owners WHERE owner IS NOT NULL

-- name: sharded_bucket_backlog
-- web_bucket_backlog for one bucket (%(bucket)s): Citus refuses that statement's subquery
-- correlated with generate_series(), so a distributed table's bucket map sends one per bucket.
SELECT count(*)
  FROM (SELECT 1 FROM dispatcher_jobs AS j
         WHERE j.bucket = %(bucket)s::smallint AND j.status = 'queued' AND j.queue_name = %(queue)s
           AND j.run_at <= now()
         LIMIT %(cap)s) AS due
