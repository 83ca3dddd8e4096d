-- Flow control (dispatcher/runtime/flow_control.py, dispatcher/api/flow.py): limits per job type and
-- queue, and paused queues. The tables and why claims check `version`: migrations/0009_flow_control.sql.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this folder.

-- name: flow_state
-- What a worker keeps a copy of, read in one snapshot: the version, the paused queues, the limits.
SELECT coalesce((SELECT version FROM dispatcher_flow_control), 0),
       ARRAY(SELECT queue_name FROM dispatcher_paused_queues ORDER BY queue_name),
       ARRAY(SELECT job_type FROM dispatcher_limits ORDER BY job_type, queue_name),
       ARRAY(SELECT queue_name FROM dispatcher_limits ORDER BY job_type, queue_name),
       ARRAY(SELECT max_running FROM dispatcher_limits ORDER BY job_type, queue_name),
       ARRAY(SELECT per_second FROM dispatcher_limits ORDER BY job_type, queue_name),
       ARRAY(SELECT burst_jobs FROM dispatcher_limits ORDER BY job_type, queue_name)

-- name: flow_gate_lock
-- A gated claim's first statement (its own transaction): lock the limit rows that bind the jobs it
-- may claim, in one order for every claimer (no deadlock), and read each one's tokens as of now
-- (clock_timestamp: a transaction that waited for the lock must not count time from before it).
-- Until this transaction ends, no other claim of these jobs can start: the next statements count
-- the running jobs in a snapshot taken after every earlier claim committed.
SELECT l.job_type, l.queue_name, l.max_running, l.per_second,
       CASE WHEN l.per_second IS NULL THEN NULL
            ELSE least(l.burst_jobs, l.tokens + greatest(0, extract(epoch FROM clock_timestamp() - l.refilled_at))
                                                * l.per_second) END,
       clock_timestamp()
  FROM dispatcher_limits AS l
  JOIN unnest(%(types)s::text[], %(queues)s::text[]) AS k(job_type, queue_name)
    ON k.job_type = l.job_type AND k.queue_name = l.queue_name
 ORDER BY l.job_type, l.queue_name
   FOR UPDATE OF l

-- name: flow_gate_running
-- How many jobs run now under each locked limit row ('*': any type, any queue), from the jobs
-- table itself (through dispatcher_jobs_lease_idx, whose predicate is status = 'running'): a dead
-- worker's jobs count until the reaper ends their leases, a finished job stops counting when its
-- write commits, and nothing is kept that could drift.
SELECT (SELECT count(*)
          FROM dispatcher_jobs AS j
         WHERE j.status = 'running'
           AND (k.job_type = '*' OR j.job_type = k.job_type)
           AND (k.queue_name = '*' OR j.queue_name = k.queue_name))
  FROM unnest(%(types)s::text[], %(queues)s::text[]) WITH ORDINALITY AS k(job_type, queue_name, n)
 ORDER BY k.n

-- name: flow_gate_spend
-- A gated claim's last statement: the rate-limited rows give up one token per job it claimed.
-- Refilled first up to %(read_at)s, the database clock flow_gate_lock counted the tokens at (the
-- claim's own milliseconds since then count at the next refill); refilled_at never moves back. A
-- parameter, not clock_timestamp() here: Citus, where this is a reference table, refuses a
-- volatile function in an UPDATE.
UPDATE dispatcher_limits AS l
   SET tokens = least(l.burst_jobs, l.tokens + greatest(0, extract(epoch FROM %(read_at)s::timestamptz - l.refilled_at))
                                              * l.per_second) - %(spent)s,
       refilled_at = greatest(l.refilled_at, %(read_at)s::timestamptz)
  FROM unnest(%(types)s::text[], %(queues)s::text[]) AS k(job_type, queue_name)
 WHERE k.job_type = l.job_type AND k.queue_name = l.queue_name AND l.per_second IS NOT NULL

-- name: flow_limit_set
-- dispatcher limits set: insert or replace one limit (its token bucket starts full), and bump the
-- flow-control version. Two CTEs side by side, not the version read inside the INSERT: Citus,
-- where these are reference tables, refuses a subquery in an INSERT.
WITH upserted AS (
    INSERT INTO dispatcher_limits AS l (job_type, queue_name, max_running, per_second, burst_jobs, tokens,
                                       refilled_at, updated_at)
    VALUES (%(job_type)s, %(queue)s, %(max_running)s, %(per_second)s, %(burst_jobs)s, %(burst_jobs)s,
            clock_timestamp(), now())
    ON CONFLICT (job_type, queue_name) DO UPDATE
       SET max_running = EXCLUDED.max_running, per_second = EXCLUDED.per_second, burst_jobs = EXCLUDED.burst_jobs,
           tokens = least(l.tokens, EXCLUDED.burst_jobs), refilled_at = EXCLUDED.refilled_at,
           updated_at = EXCLUDED.updated_at  -- the VALUES' clock: Citus takes no function here
    RETURNING l.job_type),
bumped AS (UPDATE dispatcher_flow_control SET version = version + 1 RETURNING version)
SELECT version FROM bumped, (SELECT count(*) FROM upserted) AS u

-- name: flow_limit_clear
-- dispatcher limits clear: remove limits (NULL matches any).
WITH gone AS (
    DELETE FROM dispatcher_limits
     WHERE (%(job_type)s::text IS NULL OR job_type = %(job_type)s)
       AND (%(queue)s::text IS NULL OR queue_name = %(queue)s)
    RETURNING job_type, queue_name),
bumped AS (UPDATE dispatcher_flow_control SET version = version + 1
            WHERE EXISTS (SELECT 1 FROM gone) RETURNING version)
SELECT job_type, queue_name FROM gone ORDER BY job_type, queue_name

-- name: flow_limits_list
-- dispatcher limits list: each limit with the jobs that run under it now and its tokens. The
-- running jobs are counted once per type and queue, then matched to the limits: on a Citus cluster
-- the count is one fan-out over the shards (a correlated count beside a reference table is refused).
WITH running AS MATERIALIZED (
    SELECT job_type, queue_name, count(*) AS n
      FROM dispatcher_jobs
     WHERE status = 'running'
     GROUP BY job_type, queue_name)
SELECT l.job_type, l.queue_name, l.max_running, l.per_second, l.burst_jobs,
       coalesce(sum(r.n), 0)::bigint AS running,
       CASE WHEN l.per_second IS NULL THEN NULL
            ELSE least(l.burst_jobs, l.tokens + greatest(0, extract(epoch FROM clock_timestamp() - l.refilled_at))
                                                * l.per_second) END AS tokens,
       l.updated_at
  FROM dispatcher_limits AS l
  LEFT JOIN running AS r
         ON (l.job_type = '*' OR r.job_type = l.job_type) AND (l.queue_name = '*' OR r.queue_name = l.queue_name)
 GROUP BY l.job_type, l.queue_name, l.max_running, l.per_second, l.burst_jobs, l.tokens, l.refilled_at, l.updated_at
 ORDER BY l.job_type, l.queue_name

-- name: flow_queue_pause
-- dispatcher queues pause: from this statement's commit on, no claim anywhere takes the queue's jobs.
WITH paused AS (
    INSERT INTO dispatcher_paused_queues (queue_name) VALUES (%(queue)s)
    ON CONFLICT (queue_name) DO NOTHING
    RETURNING queue_name),
bumped AS (UPDATE dispatcher_flow_control SET version = version + 1
            WHERE EXISTS (SELECT 1 FROM paused) RETURNING version)
SELECT (SELECT count(*) FROM paused) > 0

-- name: flow_queue_resume
-- dispatcher queues resume; the queue's owners are woken (one NOTIFY for the whole queue).
WITH resumed AS (
    DELETE FROM dispatcher_paused_queues WHERE queue_name = %(queue)s RETURNING queue_name),
bumped AS (UPDATE dispatcher_flow_control SET version = version + 1
            WHERE EXISTS (SELECT 1 FROM resumed) RETURNING version)
SELECT (SELECT count(*) FROM resumed) > 0,
       (SELECT count(pg_notify(%(channel)s, queue_name)) FROM resumed)

-- name: flow_paused_list
-- Paused queues, with when each was paused.
SELECT queue_name, paused_at FROM dispatcher_paused_queues ORDER BY queue_name
