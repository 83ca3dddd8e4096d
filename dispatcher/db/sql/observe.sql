-- What the queue looks like and what it costs (`dispatcher status`, metrics).
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code
-- with validated integers only.

-- name: status_counts
-- Jobs per queue and status, the archive's completed ones (migration 0020) with the rest.
SELECT c.queue_name, c.status, sum(c.jobs)::bigint AS jobs
  FROM (SELECT queue_name, status, count(*) AS jobs FROM dispatcher_jobs GROUP BY queue_name, status
        UNION ALL
        SELECT queue_name, 'completed', count(*) FROM dispatcher_jobs_archive GROUP BY queue_name) AS c
 GROUP BY c.queue_name, c.status
 ORDER BY c.queue_name, c.status

-- name: status_halted_keys
-- Ordering keys halted by a failed or discarded job, per queue: through
-- dispatcher_jobs_ordering_holder_idx (the keys' holders only: one entry per key in use).
SELECT queue_name, count(*) AS halted_keys
  FROM dispatcher_jobs
 WHERE ordering_key IS NOT NULL AND ordering_halted
 GROUP BY queue_name

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
-- it is granted pg_read_all_stats (docs/operations/roles.md).
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
-- and due, scheduled (queued, run_at in the future), running, failed, discarded, cancelled,
-- waiting (behind an ordering key), and 'halted': the keys a failed or discarded job halts (a
-- gauge of its own, dispatcher_queue_halted_keys: those jobs are counted under their status); and
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
UNION ALL
-- Ordering keys (migration 0008): the jobs waiting behind an earlier job of their key, through
-- dispatcher_jobs_ordering_waiting_idx, and the keys a failed or discarded job halts (those jobs
-- are counted as failed or discarded too), through dispatcher_jobs_ordering_holder_idx: its
-- entries are the keys' holders only, one per key in use. No keyed job: two empty index scans.
SELECT queue_name, 'waiting', count(*), NULL FROM dispatcher_jobs WHERE status = 'waiting' GROUP BY queue_name
UNION ALL
SELECT queue_name, 'halted', count(*), NULL FROM dispatcher_jobs
 WHERE ordering_key IS NOT NULL AND ordering_halted GROUP BY queue_name

-- name: workers_live_by_mode
-- The live workers of the worker registry (migration 0016) per mode and coordinator, for the
-- dispatcher_workers gauge (the table sampler, one pod at a time). A pair whose workers are all
-- gone counts 0 while their rows are kept (an hour after they were last seen). A handful of rows.
SELECT mode, coordinator, (count(*) FILTER (WHERE expires_at > now() AND stopped_at IS NULL))::int
  FROM dispatcher_workers
 GROUP BY mode, coordinator
 ORDER BY mode, coordinator

-- name: locked_tables
-- Our tables that another session holds a lock on that blocks reads or writes (SHARE or stronger),
-- named by a one-shot command that gave up waiting for a lock (dispatcher/db/oneshot.py). pg_locks
-- and pg_class take no lock on those tables, so this never waits on them.
SELECT DISTINCT c.relname::text
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
 WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
   AND c.relname LIKE 'dispatcher\_%'
 ORDER BY 1

-- name: status_members
-- The live members of each coordination group of the PostgreSQL coordinator (coordinator/sql), with
-- the age of their last heartbeat, how long they have been up, whether they are leaving and whether
-- they lead it. Rows past their expiry are dead members not yet cleaned up: left out. A few rows.
SELECT m.queue, m.member_id, extract(epoch FROM now() - m.heartbeat_at)::float8,
       extract(epoch FROM now() - m.started_at)::float8, m.leaving, coalesce(l.leader_id = m.member_id, false)
  FROM dispatcher_members AS m
  LEFT JOIN dispatcher_leader AS l ON l.queue = m.queue AND l.expires_at > now()
 WHERE m.expires_at > now()
 ORDER BY m.queue, m.member_id

-- name: status_leaders
SELECT queue, leader_id, term FROM dispatcher_leader WHERE expires_at > now() ORDER BY queue

-- name: status_bucket_owners
-- Each group's 64 buckets: the owner, and the next owner while a hand-off is in progress.
SELECT queue, bucket, owner, next_owner FROM dispatcher_bucket_owners ORDER BY queue, bucket
