-- Uniqueness windows (migration 0011; how they stay race-free: docs/design/enqueue.md): the
-- statements that enqueue jobs with `dedupe_window_s` run besides the plain inserts of enqueue.sql
-- and ordering.sql, and the pruner's. A job without a window never runs any of them.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder and fills in {window_until} and {key_held} (_FRAGMENTS there).

-- name: dedupe_window_until
-- A fragment: when the window of `w` (a dispatcher_dedupe_windows row) ends, given `j`, its job
-- LEFT JOINed by id: never while the job is live; its window after it finished (updated_at is
-- when: nothing writes a finished row after that); after `finished_at` once the row is deleted
-- (written by the statement that deleted it), or after `enqueued_at` if a statement that does not
-- close windows deleted it (the earliest the job can have finished).
CASE WHEN j.id IS NULL THEN coalesce(w.finished_at, w.enqueued_at) + w.window_s * interval '1 second'
     WHEN j.status IN ('queued', 'running', 'waiting') THEN 'infinity'::timestamptz
     ELSE j.updated_at + w.window_s * interval '1 second' END

-- name: dedupe_key_held
-- A fragment: whether the key of `k` (queue_name, dedupe_key) is held, as this statement's
-- snapshot sees it: a live job of the queue has it, in any bucket (a prefix of
-- dispatcher_jobs_dedupe_live_idx), or a window on it has not ended. Windows are per (queue, key),
-- whatever placed the job. statement_timestamp(), not now(): an enqueue inside a long transaction
-- must not see old windows as still open.
(EXISTS (SELECT 1 FROM dispatcher_jobs AS l
          WHERE l.queue_name = k.queue_name AND l.dedupe_key = k.dedupe_key
            AND l.status IN ('queued', 'running', 'waiting'))
 OR EXISTS (SELECT 1 FROM dispatcher_dedupe_windows AS w LEFT JOIN dispatcher_jobs AS j ON j.id = w.job_id
             WHERE w.queue_name = k.queue_name AND w.dedupe_key = k.dedupe_key
               AND {window_until} > statement_timestamp()))

-- name: dedupe_key_lock
-- Whether (queue, dedupe_key) is held; if not, take the key's transaction-scoped advisory lock
-- (every windowed enqueue of the key takes it: they go one at a time). A refusal takes no lock: what
-- this snapshot shows (a live job, or one that finished within its window) was so when it was
-- taken. A snapshot that shows the key free may be old, so enqueue runs this again once it holds
-- the lock: that statement's snapshot is taken after the lock was granted, and sees every
-- windowed enqueue of the key that committed before, and every job's end that did.
-- (queue, key) -> one int4 by hashtext, queue names having no newline; a collision only makes two
-- keys wait for each other. Class 1147: the two-int lock space, apart from the pruner's bigint lock.
-- The check is dedupe_key_held's with the key given as parameters, not as a row `k`: Citus
-- refuses a subquery correlated with a FROM that reads no table.
-- The window's job is read by its id (a derived table filtered by the window's job_id), not by a
-- join: on a Citus cluster a join of the coordinator node's windows with the jobs pulled every
-- job of every shard to the coordinator node; this way only that job's row travels.
SELECT held, CASE WHEN NOT held THEN pg_advisory_xact_lock(1147, hashtext(%(queue)s::text || E'\n' || %(dedupe_key)s::text))::text END
  FROM (SELECT (EXISTS (SELECT 1 FROM dispatcher_jobs AS l
                         WHERE l.queue_name = %(queue)s AND l.dedupe_key = %(dedupe_key)s
                           AND l.status IN ('queued', 'running', 'waiting'))
                OR EXISTS (SELECT 1 FROM dispatcher_dedupe_windows AS w
                              LEFT JOIN (SELECT l.id, l.status, l.updated_at FROM dispatcher_jobs AS l
                                          WHERE l.id = ANY(ARRAY(SELECT x.job_id FROM dispatcher_dedupe_windows AS x
                                                                  WHERE x.queue_name = %(queue)s
                                                                    AND x.dedupe_key = %(dedupe_key)s))) AS j
                                ON j.id = w.job_id
                            WHERE w.queue_name = %(queue)s AND w.dedupe_key = %(dedupe_key)s
                              AND {window_until} > statement_timestamp())) AS held) AS h

-- name: dedupe_window_open
-- After the job went in (under the key's lock): its window becomes the key's, replacing one that
-- ended.
INSERT INTO dispatcher_dedupe_windows AS w (queue_name, dedupe_key, job_id, window_s, enqueued_at, finished_at,
                                            prune_after)
VALUES (%(queue)s, %(dedupe_key)s, %(job_id)s, %(window_s)s, now(), NULL,
        now() + %(window_s)s * interval '1 second')
ON CONFLICT (queue_name, dedupe_key) DO UPDATE
   SET job_id = EXCLUDED.job_id, window_s = EXCLUDED.window_s, enqueued_at = EXCLUDED.enqueued_at,
       finished_at = NULL, prune_after = EXCLUDED.prune_after

-- name: dedupe_stage_lock
-- Bulk enqueue: the advisory lock of every key of the staged rows that have a window, in lock
-- order (two batches never wait for each other's locks in a circle).
SELECT count(*)
  FROM (SELECT pg_advisory_xact_lock(1147, h.lock_key)::text
          FROM (SELECT DISTINCT hashtext(queue_name || E'\n' || dedupe_key) AS lock_key
                  FROM dispatcher_jobs_stage_v3 WHERE dedupe_window_s IS NOT NULL ORDER BY 1) AS h) AS locked

-- name: dedupe_stage_refuse
-- Then, in a snapshot taken after those locks: staged rows with a window whose key is held are
-- not enqueued, nor those after another staged row of their key, which holds it by then as it
-- would one by one. The publish's conflict skips only duplicates in the same bucket (the dedupe
-- index holds the bucket), and a key's window names one job.
DELETE FROM dispatcher_jobs_stage_v3 AS k
 WHERE k.dedupe_window_s IS NOT NULL
   AND ({key_held}
        OR EXISTS (SELECT 1 FROM dispatcher_jobs_stage_v3 AS e
                    WHERE e.queue_name = k.queue_name AND e.dedupe_key = k.dedupe_key AND e.n < k.n))

-- name: dedupe_stage_open
-- After the publish: each staged key's live job that has a window is this batch's (no other
-- windowed enqueue of the key could run while we hold its lock, and the refusal left no key a
-- live job held): its window becomes the key's.
INSERT INTO dispatcher_dedupe_windows AS w (queue_name, dedupe_key, job_id, window_s, enqueued_at, finished_at,
                                            prune_after)
SELECT j.queue_name, j.dedupe_key, j.id, j.dedupe_window_s, now(), NULL,
       now() + j.dedupe_window_s * interval '1 second'
  FROM (SELECT DISTINCT queue_name, dedupe_key FROM dispatcher_jobs_stage_v3 WHERE dedupe_window_s IS NOT NULL) AS k
  JOIN dispatcher_jobs AS j  -- dispatcher_jobs_dedupe_live_idx
    ON j.queue_name = k.queue_name AND j.dedupe_key = k.dedupe_key AND j.status IN ('queued', 'running', 'waiting')
 WHERE j.dedupe_window_s IS NOT NULL
ON CONFLICT (queue_name, dedupe_key) DO UPDATE
   SET job_id = EXCLUDED.job_id, window_s = EXCLUDED.window_s, enqueued_at = EXCLUDED.enqueued_at,
       finished_at = NULL, prune_after = EXCLUDED.prune_after

-- name: dedupe_windows_prune
-- The pruner: up to %(limit)s windows whose prune_after passed, oldest first; those that ended are
-- deleted, the others (job still live, or finished within its window) get a later prune_after.
-- SKIP LOCKED: a window an enqueue is replacing right now is left for the next round. Returns how
-- many were looked at and how many deleted. The later prune_after is computed in `due`, not in
-- the UPDATE: Citus refuses a function that is not immutable inside a CASE of a write.
-- The windows' jobs are read by id, as in dedupe_key_lock.
WITH picked AS MATERIALIZED (
    SELECT * FROM dispatcher_dedupe_windows
     WHERE prune_after < statement_timestamp()
     ORDER BY prune_after
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
due AS MATERIALIZED (
    SELECT d.*, CASE WHEN d.until = 'infinity' THEN statement_timestamp() + d.window_s * interval '1 second'
                     ELSE d.until END AS later
      FROM (SELECT w.queue_name, w.dedupe_key, w.window_s, {window_until} AS until
              FROM picked AS w
              LEFT JOIN (SELECT l.id, l.status, l.updated_at FROM dispatcher_jobs AS l
                          WHERE l.id = ANY(ARRAY(SELECT p.job_id FROM picked AS p))) AS j
                ON j.id = w.job_id) AS d
),
pruned AS (
    DELETE FROM dispatcher_dedupe_windows AS w
     USING due AS d
     WHERE w.queue_name = d.queue_name AND w.dedupe_key = d.dedupe_key AND d.until <= statement_timestamp()
    RETURNING 1
),
deferred AS (
    UPDATE dispatcher_dedupe_windows AS w
       SET prune_after = d.later
      FROM due AS d
     WHERE w.queue_name = d.queue_name AND w.dedupe_key = d.dedupe_key AND d.until > statement_timestamp()
)
SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM pruned)

-- name: dedupe_windows_close
-- A fragment for a statement that deleted jobs and defined `gone(id, queue_name, dedupe_key,
-- dedupe_window_s, finished_at)`: the deleted jobs that had a window (rare) leave their finish
-- time in their key's window, if it is still theirs. Defines `closed`. The windows are found by
-- job id (dispatcher_dedupe_windows_job_idx) from an array of exactly those jobs: a statement
-- that deleted none reads no window (an empty array scans nothing), however many there are; a
-- join with `gone` let the planner hash it against a scan of the whole table.
closed AS (
    UPDATE dispatcher_dedupe_windows AS w
       SET (finished_at, prune_after) = (SELECT g.finished_at, g.finished_at + w.window_s * interval '1 second'
                                           FROM gone AS g WHERE g.id = w.job_id LIMIT 1)
     WHERE w.job_id = ANY(ARRAY(SELECT g.id FROM gone AS g WHERE g.dedupe_window_s IS NOT NULL))
)

-- name: dedupe_windows_close_batch
-- A fragment, the CTE `closed`: under DISPATCHER_COMPLETED_JOBS=delete, the completion
-- (jobs_complete_owned_delete_fenced) closes, in the same statement, the windows of the batch's
-- running jobs that have one. They are found through
-- dispatcher_jobs_windowed_running_idx, which holds only running jobs with a window (`id + 0`
-- keeps the batch's ids a filter there, never a probe of the primary key per id): a batch
-- without them reads one index page and no window (docs/design/enqueue.md).
-- A job of the batch whose token no longer matches is not deleted, and its window is closed all
-- the same: harmless, a window reads its job's row while there is one, and is closed again when
-- that row is deleted.
closed AS (
    UPDATE dispatcher_dedupe_windows AS w
       SET finished_at = now(),
           prune_after = now() + w.window_s * interval '1 second'
     WHERE w.job_id = ANY(ARRAY(
               SELECT r.id
                 FROM dispatcher_jobs AS r  -- dispatcher_jobs_windowed_running_idx
                WHERE r.dedupe_window_s IS NOT NULL AND r.status = 'running'
                  AND r.id + 0 = ANY(%(ids)s::bigint[])))
)

-- name: jobs_complete_owned_delete_fenced
-- DISPATCHER_COMPLETED_JOBS=delete: jobs_complete_owned_fenced with the batch's windows closed
-- first ({close_batch_windows}); {completion} is jobs_complete_owned_delete, filled in by the
-- store (dispatcher/db/completions.py): the same fenced DELETE, the same plan.
WITH {close_batch_windows},
done AS (
{completion}
    RETURNING j.id, j.has_dependents, j.awaited
)
SELECT ARRAY(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM done),
       ARRAY(SELECT id FROM done WHERE has_dependents),
       (SELECT count(pg_notify(%(results_channel)s, id || ':completed')) FROM done WHERE awaited)

-- name: dedupe_windows_close_released
-- A fragment: the same for jobs_complete_owned_keyed under DISPATCHER_COMPLETED_JOBS=delete, whose
-- `released` (the deleted rows, returned already) the store extends with the columns `gone` needs
-- (completions.closing_keyed).
gone AS (SELECT id, queue_name, dedupe_key, dedupe_window_s, now() AS finished_at FROM released),
{close_windows}

-- name: dedupe_keys_lock
-- A keyed batch on a Citus cluster, which enqueue.py inserts job by job: first the advisory lock
-- of every key of %(queues)s/%(keys)s (its jobs with a window), in lock order, as
-- dedupe_stage_lock takes them for staged rows: two batches never wait for each other in a circle.
SELECT count(*)
  FROM (SELECT pg_advisory_xact_lock(1147, h.lock_key)::text
          FROM (SELECT DISTINCT hashtext(t.queue_name || E'\n' || t.dedupe_key) AS lock_key
                  FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS t(queue_name, dedupe_key)
                 ORDER BY 1) AS h) AS locked
