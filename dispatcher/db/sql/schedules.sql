-- Recurring jobs (dispatcher/api/schedules/, migration 0012): the round of the holder of a
-- queue's `schedules:<queue>` lease, and what operators read.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style.

-- name: schedules_try_lock
-- A round is one transaction that first takes this lock, without waiting: one round per queue at
-- a time, even when a holder whose lease ran out mid-round meets the next one. Transaction-scoped,
-- so it works through PgBouncer in transaction pooling and is gone with the transaction.
SELECT pg_try_advisory_xact_lock(hashtextextended('dispatcher_schedules:' || %(queue)s, 0))

-- name: schedules_read
-- The queue's schedules (and any declared here under another queue), with the database's clock:
-- every slot of the round is computed from this now(), never from the worker's clock.
SELECT now(), name, fingerprint, next_slot_at, removed_at IS NOT NULL, last_success_at, declared_at
  FROM dispatcher_schedules
 WHERE queue_name = %(queue)s OR name = ANY(%(names)s::text[])

-- name: schedule_declare
-- A new schedule, a changed one, or one declared again after it was removed: it starts from
-- %(next_slot_at)s, the cadence's next slot.
INSERT INTO dispatcher_schedules AS s (name, queue_name, job_type, cadence, time_zone, catch_up, fingerprint,
                                       next_slot_at)
VALUES (%(name)s, %(queue)s, %(job_type)s, %(cadence)s, %(time_zone)s, %(catch_up)s, %(fingerprint)s,
        %(next_slot_at)s)
ON CONFLICT (name) DO UPDATE
   SET queue_name = excluded.queue_name, job_type = excluded.job_type, cadence = excluded.cadence,
       time_zone = excluded.time_zone, catch_up = excluded.catch_up, fingerprint = excluded.fingerprint,
       next_slot_at = excluded.next_slot_at, updated_at = now(), removed_at = NULL

-- name: schedule_remove
-- A schedule the holder's code no longer declares: it enqueues nothing more.
UPDATE dispatcher_schedules SET removed_at = now(), updated_at = now() WHERE name = %(name)s AND removed_at IS NULL

-- name: schedule_drop_ahead
-- The jobs a schedule enqueued ahead for slots still to come, and their slots, go when the
-- schedule is removed or changed: the new declaration enqueues its own. Only jobs still queued
-- (a slot to come cannot have started: its run_at is the slot).
WITH ahead AS (
    DELETE FROM dispatcher_schedule_runs
     WHERE schedule_name = %(name)s AND slot_at > now() AND outcome IS NULL
    RETURNING job_id
)
DELETE FROM dispatcher_jobs
 WHERE id = ANY(ARRAY(SELECT job_id FROM ahead WHERE job_id IS NOT NULL)) AND status = 'queued'

-- name: schedule_enqueue_slot
-- The job of one slot, and the slot's row, in one statement. A slot that already has its row
-- enqueues nothing (no row back); a second holder racing this one fails on the primary key and its
-- transaction, job included, rolls back. The job is due at its slot: a slot not due yet appends
-- ':<ms until due>' to the notification, so its bucket's owner arms its due timer (as
-- jobs_insert_one, sql/enqueue.sql).
WITH inserted AS (
    INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given,
                                 run_at, scheduled_for)
    SELECT %(queue)s, %(job_type)s, %(payload)s, %(priority)s, %(bucket)s, coalesce(%(max_attempts)s::int, 20),
           %(max_attempts)s::int IS NOT NULL, %(slot_at)s, %(slot_at)s
     WHERE NOT EXISTS (SELECT 1 FROM dispatcher_schedule_runs
                        WHERE schedule_name = %(name)s AND slot_at = %(slot_at)s)
    RETURNING id, run_at
),
taken AS (
    INSERT INTO dispatcher_schedule_runs (schedule_name, slot_at, job_id)
    SELECT %(name)s, %(slot_at)s, id FROM inserted
)
SELECT id, pg_notify(%(channel)s, %(notify)s || CASE WHEN due_in_ms > 0 THEN ':' || due_in_ms ELSE '' END)
  FROM (SELECT id, ceil(1000 * extract(epoch FROM run_at - clock_timestamp()))::bigint AS due_in_ms
          FROM inserted) AS i

-- name: schedule_advance
-- Move the cursor past the slots this round decided. Never backwards.
UPDATE dispatcher_schedules SET next_slot_at = %(next_slot_at)s, updated_at = now()
 WHERE name = %(name)s AND next_slot_at < %(next_slot_at)s

-- name: schedule_runs_settle
-- Record how the queue's runs ended, and each schedule's latest success (returned: name -> epoch
-- seconds, for the schedules whose latest success this round saw). A run whose job row is
-- gone before a round saw it end reads %(gone)s: 'completed' under DISPATCHER_COMPLETED_JOBS=delete
-- (that is how a success ends there), else 'gone' (purged). Reads the open runs through
-- dispatcher_schedule_runs_open_idx: the runs of jobs still live, a handful. A run's end time is
-- read in `open`, not in the UPDATE: Citus refuses now() inside a COALESCE of a write.
-- The runs' jobs are read by id, in the jobs table and in the archive of completed jobs (migration
-- 0020), not by a join: on a Citus cluster a join of the coordinator
-- node's runs with the jobs pulled every job of every shard to the coordinator node.
WITH runs AS MATERIALIZED (
    SELECT r.schedule_name, r.slot_at, r.job_id
      FROM dispatcher_schedule_runs AS r
     WHERE r.outcome IS NULL AND r.job_id IS NOT NULL AND r.schedule_name = ANY(%(names)s::text[])
),
open AS (
    SELECT r.schedule_name, r.slot_at, j.id AS job_id, j.status, coalesce(j.updated_at, now()) AS ended_at
      FROM runs AS r
      LEFT JOIN (SELECT l.id, l.status, l.updated_at FROM dispatcher_jobs AS l
                  WHERE l.id = ANY(ARRAY(SELECT x.job_id FROM runs AS x))
                 UNION ALL
                 SELECT a.id, a.status, a.updated_at FROM dispatcher_jobs_archive AS a
                  WHERE a.id = ANY(ARRAY(SELECT x.job_id FROM runs AS x))) AS j
        ON j.id = r.job_id
),
ended AS (
    UPDATE dispatcher_schedule_runs AS r
       SET outcome = coalesce(o.status, %(gone)s), finished_at = o.ended_at
      FROM open AS o
     WHERE r.schedule_name = o.schedule_name AND r.slot_at = o.slot_at
       AND (o.job_id IS NULL OR o.status IN ('completed', 'failed', 'discarded', 'cancelled'))
    RETURNING r.schedule_name, r.outcome, r.finished_at
),
succeeded AS (
    UPDATE dispatcher_schedules AS s
       SET last_success_at = greatest(s.last_success_at, e.at)
      FROM (SELECT schedule_name, max(finished_at) AS at FROM ended WHERE outcome = 'completed'
             GROUP BY schedule_name) AS e
     WHERE s.name = e.schedule_name
    RETURNING s.name, s.last_success_at
)
SELECT (SELECT count(*) FROM ended),
       coalesce((SELECT jsonb_object_agg(name, extract(epoch FROM last_success_at)) FROM succeeded), '{}')

-- name: schedule_runs_prune
-- Keep the latest %(keep)s ended runs of each of the queue's schedules (their history in
-- `schedules list` and the admin API). Pruning never lets a slot run twice: the cursor only moves
-- forward, so a pruned slot is never considered again.
DELETE FROM dispatcher_schedule_runs AS r
 USING (SELECT n.name,
               (SELECT x.slot_at FROM dispatcher_schedule_runs AS x
                 WHERE x.schedule_name = n.name ORDER BY x.slot_at DESC OFFSET %(keep)s LIMIT 1) AS cutoff
          FROM unnest(%(names)s::text[]) AS n(name)) AS c
 WHERE r.schedule_name = c.name AND r.slot_at <= c.cutoff AND r.outcome IS NOT NULL

-- name: schedules_list
-- Every schedule with its next slot (the earliest enqueued ahead, else the cursor; none once
-- removed), its latest run that was due, and how that run ended (its job's status while live).
-- The latest runs' jobs are read by id, as in schedule_runs_settle.
WITH listed AS MATERIALIZED (
    SELECT s.name, s.queue_name, s.job_type, s.cadence, s.time_zone, s.catch_up,
           CASE WHEN s.removed_at IS NULL THEN
                coalesce((SELECT min(r.slot_at) FROM dispatcher_schedule_runs AS r
                           WHERE r.schedule_name = s.name AND r.slot_at > now()), s.next_slot_at) END AS next_slot_at,
           last.slot_at, last.outcome, last.job_id, s.last_success_at, s.declared_at, s.removed_at
      FROM dispatcher_schedules AS s
      LEFT JOIN LATERAL (SELECT r.slot_at, r.outcome, r.job_id FROM dispatcher_schedule_runs AS r
                          WHERE r.schedule_name = s.name AND r.slot_at <= now()
                          ORDER BY r.slot_at DESC LIMIT 1) AS last ON true
     WHERE %(queue)s::text IS NULL OR s.queue_name = %(queue)s
)
SELECT x.name, x.queue_name, x.job_type, x.cadence, x.time_zone, x.catch_up, x.next_slot_at, x.slot_at,
       coalesce(x.outcome, j.status, CASE WHEN x.slot_at IS NOT NULL THEN 'gone' END),
       x.job_id, x.last_success_at, x.declared_at, x.removed_at
  FROM listed AS x
  LEFT JOIN (SELECT l.id, l.status FROM dispatcher_jobs AS l
              WHERE l.id = ANY(ARRAY(SELECT y.job_id FROM listed AS y))) AS j
    ON j.id = x.job_id
 ORDER BY x.name
