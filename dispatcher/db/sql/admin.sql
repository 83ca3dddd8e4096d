-- Failed-job admin (dispatcher/admin.py, `dispatcher jobs ...`). Each statement runs in its own
-- short transaction with a local statement_timeout and lock_timeout (db/oneshot.py), never prepared,
-- so it is planned with its parameters' values: a filter left out ({filters}: NULL) folds away
-- and a status filter can use the partial index of that status (queued: the claim indexes,
-- running: the lease index, completed / failed, discarded, cancelled: the indexes of migration
-- 0007, which are also ordered by age). Queue and job type are filters on those rows, with no
-- index of their own: an index on every row would cost every claim and completion a write.
--
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code
-- with validated integers only.

-- name: admin_filters
-- The filters of every admin statement, on the row `j`; a NULL parameter means "any". The age is
-- by updated_at: the time a job entered its status (enqueued or retried, claimed, finished), up
-- to now, or to %(as_of)s: a confirmed count, whose jobs a later change must not outgrow (a job
-- whose row changed after it, claimed or failed since, is left alone).
    (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
AND (%(queues)s::text[] IS NULL OR j.queue_name = ANY(%(queues)s::text[]))
AND (%(job_types)s::text[] IS NULL OR j.job_type = ANY(%(job_types)s::text[]))
AND (%(older_than_s)s::float8 IS NULL
     OR j.updated_at < coalesce(%(as_of)s::timestamptz, now()) - %(older_than_s)s::float8 * interval '1 second')
AND (%(newer_than_s)s::float8 IS NULL
     OR j.updated_at >= coalesce(%(as_of)s::timestamptz, now()) - %(newer_than_s)s::float8 * interval '1 second')
AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
AND (NOT %(halted)s::bool OR j.ordering_halted)
AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
AND (%(as_of)s::timestamptz IS NULL OR j.updated_at <= %(as_of)s::timestamptz)
-- tags: jobs having every one of them, by containment, which dispatcher_jobs_tags_idx (GIN, 0017) serves
AND (%(tags)s::text[] IS NULL OR j.tags @> %(tags)s::text[])
-- a batch: its members and its callback, through dispatcher_jobs_batch_idx (0017)
AND (%(batch_id)s::bigint IS NULL OR j.batch_id = %(batch_id)s::bigint)
-- a search: the payload contains one of the objects given, the last error contains the text (its
-- wildcards escaped by Filters.params), checked on each row: no index serves them (one on the
-- payload would cost every enqueue), so a page of a search walks one window of the primary key,
-- from %(min_id)s up (admin.search_jobs)
AND (%(payload)s::jsonb[] IS NULL OR j.payload @> ANY(%(payload)s::jsonb[]))
AND (%(error_like)s::text IS NULL OR j.last_error ILIKE %(error_like)s::text)
AND (%(min_id)s::bigint IS NULL OR j.id >= %(min_id)s::bigint)

-- name: admin_jobs_list
-- Newest first (by id, the order of enqueueing): a walk of the primary key backwards that stops
-- at %(limit)s, or, for a status with few rows, that status's index and a sort; the same in the
-- archive of completed jobs (migration 0020: each partition's primary key), and the newest of
-- both. A filter on a status other than completed skips the archive: its CHECK refutes it.
SELECT u.* FROM (
    (SELECT j.id, j.queue_name, j.job_type, j.status, j.priority, j.attempts,
            CASE WHEN j.max_attempts_given THEN j.max_attempts END AS max_attempts, j.run_at, j.created_at,
            j.updated_at, extract(epoch FROM now() - j.updated_at)::float8, j.locked_by, j.cancel_requested_at,
            j.last_error, j.tags
       FROM dispatcher_jobs AS j
      WHERE {filters}
      ORDER BY j.id DESC
      LIMIT %(limit)s)
    UNION ALL
    (SELECT j.id, j.queue_name, j.job_type, j.status, j.priority, j.attempts,
            CASE WHEN j.max_attempts_given THEN j.max_attempts END AS max_attempts, j.run_at, j.created_at,
            j.updated_at, extract(epoch FROM now() - j.updated_at)::float8, j.locked_by, j.cancel_requested_at,
            j.last_error, j.tags
       FROM dispatcher_jobs_archive AS j
      WHERE {filters}
      ORDER BY j.id DESC
      LIMIT %(limit)s)) AS u
 ORDER BY u.id DESC
 LIMIT %(limit)s

-- name: admin_jobs_count
-- How many jobs match (what a bulk change would touch), the newest id among them and the
-- instant: a bulk change goes up to that id (jobs enqueued meanwhile are not swept in), and a
-- confirmed one also as of that instant (admin_filters). Both tables: the archive holds completed
-- jobs, which only a purge touches.
SELECT sum(c.matched)::bigint, max(c.newest), now()
  FROM (SELECT count(*) AS matched, max(j.id) AS newest FROM dispatcher_jobs AS j WHERE {filters}
        UNION ALL
        SELECT count(*), max(j.id) FROM dispatcher_jobs_archive AS j WHERE {filters}) AS c

-- name: admin_jobs_page
-- The next batch of a bulk change: ids after %(after_id)s (keyset, so each batch is one short
-- range and the walk ends even if rows keep matching), up to %(max_id)s, in both tables.
SELECT u.id FROM (
    (SELECT j.id
       FROM dispatcher_jobs AS j
      WHERE {filters} AND j.id > %(after_id)s AND j.id <= %(max_id)s
      ORDER BY j.id
      LIMIT %(limit)s)
    UNION ALL
    (SELECT j.id
       FROM dispatcher_jobs_archive AS j
      WHERE {filters} AND j.id > %(after_id)s AND j.id <= %(max_id)s
      ORDER BY j.id
      LIMIT %(limit)s)) AS u
 ORDER BY u.id
 LIMIT %(limit)s

-- name: admin_jobs_id_range
-- The lowest and the highest id in both tables: probes of the primary keys. A search's first
-- window ends above the highest; a window whose floor is above the lowest has older ones below.
SELECT least((SELECT min(j.id) FROM dispatcher_jobs AS j), (SELECT min(a.id) FROM dispatcher_jobs_archive AS a)),
       greatest((SELECT max(j.id) FROM dispatcher_jobs AS j), (SELECT max(a.id) FROM dispatcher_jobs_archive AS a))

-- name: admin_job_show
-- The job's row, in the jobs table or, completed, in the archive (each partition's primary key).
SELECT id, queue_name, job_type, status, priority, bucket, attempts,
       CASE WHEN max_attempts_given THEN max_attempts END AS max_attempts, lease_expiries, run_at,
       created_at, updated_at, locked_at, locked_by, lease_expires_at, completed_at, failed_at,
       cancel_requested_at, dedupe_key, payload, last_error, ordering_key, ordering_halted, snoozes, errors, tags,
       progress, meta, depends_on, pending_parents, batch_id, result
  FROM dispatcher_jobs
 WHERE id = %(id)s
UNION ALL
SELECT id, queue_name, job_type, status, priority, bucket, attempts,
       CASE WHEN max_attempts_given THEN max_attempts END AS max_attempts, lease_expiries, run_at,
       created_at, updated_at, locked_at, locked_by, lease_expires_at, completed_at, failed_at,
       cancel_requested_at, dedupe_key, payload, last_error, ordering_key, ordering_halted, snoozes, errors, tags,
       progress, meta, depends_on, pending_parents, batch_id, result
  FROM dispatcher_jobs_archive
 WHERE id = %(id)s
 LIMIT 1

-- name: admin_job_attempts
-- The job's attempt history (rows exist only with DISPATCHER_HISTORY on), through its index.
SELECT attempt, worker, started_at, finished_at, duration_ms, outcome, error
  FROM dispatcher_job_attempts
 WHERE job_id = %(id)s
 ORDER BY attempt, started_at
 LIMIT %(limit)s

-- name: admin_jobs_retry
-- Failed or discarded jobs among %(ids)s that still match the filters, back to queued, due now.
-- As River's JobRetry and Oban's retry_job: the attempt count stays (the history goes on) and
-- max_attempts rises to allow one more attempt if they were used up (a NULL one, not given at
-- enqueue, stays NULL: an attempt always runs once claimed, and the handler's limit then decides);
-- its snoozes start again from 0 (DISPATCHER_MAX_SNOOZES); last_error stays for
-- people, a stale cancel request goes. The status is re-checked on the row the UPDATE writes:
-- a job that changed meanwhile is skipped. A job whose dedupe key a live job holds now (or
-- another job of this batch, the lowest id of which goes) is skipped too: two live jobs may not
-- share a key. A keyed job that halts its key (ordering_halted) is still its holder: it becomes
-- queued and the halt ends. One that does not hold its key (its handler let the key go on)
-- waits: it is older than every job of its key still to run, so it is promoted next, by
-- ordering_promote_keys (admin.py runs it on the keys this returns once this commits).
-- Shape, in the three statements of a change: the conditions sit in a CASE, so
-- that the rows are fetched by primary key (the batch) and not through a status index bitmap
-- ANDed with it (5 ms per batch at 100k failed rows, growing with them); the report comes back
-- as the changed rows (with their key), then every id with its row as it was before this
-- statement (status, whether the filters matched, whether its dedupe key was held, whether it
-- halted its key), joined in admin.py: a join of
-- the two here was planned as a nested loop over the CTE (100 ms per 1,000 ids).
WITH changed AS (
    UPDATE dispatcher_jobs AS j
       SET status = CASE WHEN j.ordering_key IS NULL OR j.ordering_halted THEN 'queued' ELSE 'waiting' END,
           ordering_halted = false,
           run_at = now(),
           max_attempts = greatest(j.max_attempts, j.attempts + 1),  -- a job not given one: its handler's applies
           snoozes = 0,
           failed_at = NULL,
           cancel_requested_at = NULL,
           updated_at = now()
     WHERE j.id = ANY(%(ids)s::bigint[])
       AND CASE WHEN j.status IN ('failed', 'discarded') THEN {filters} AND (j.dedupe_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS d
                         WHERE d.queue_name = j.queue_name AND d.dedupe_key = j.dedupe_key
                           AND d.status IN ('queued', 'running', 'waiting'))
            AND j.id = (SELECT min(b.id) FROM dispatcher_jobs AS b
                         WHERE b.id = ANY(%(ids)s::bigint[]) AND b.queue_name = j.queue_name
                           AND b.dedupe_key = j.dedupe_key AND b.status IN ('failed', 'discarded'))))
            ELSE false END
    RETURNING j.id, j.status, j.queue_name, j.dedupe_key, j.ordering_key
)
SELECT id, NULL, NULL, status, NULL, NULL, queue_name, ordering_key FROM changed
UNION ALL
SELECT t.id, j.status, coalesce({filters}, false), NULL,
       j.dedupe_key IS NOT NULL AND (
           EXISTS (SELECT 1 FROM dispatcher_jobs AS d  -- through dispatcher_jobs_dedupe_live_idx
                    WHERE d.queue_name = j.queue_name AND d.dedupe_key = j.dedupe_key
                      AND d.status IN ('queued', 'running', 'waiting'))
           OR EXISTS (SELECT 1 FROM changed AS c
                       WHERE c.queue_name = j.queue_name AND c.dedupe_key = j.dedupe_key AND c.id <> j.id)),
       j.ordering_halted, NULL, NULL
  FROM unnest(%(ids)s::bigint[]) AS t(id)
  LEFT JOIN dispatcher_jobs AS j ON j.id = t.id

-- name: admin_jobs_cancel
-- Jobs among %(ids)s that still match the filters: a queued, waiting or blocked one (due or
-- scheduled) becomes 'cancelled' at once (admin.py then releases its children, sql/deps.sql) and never runs; a running one gets a cancel request
-- (cancel_requested_at) that its owner reads with its next heartbeat, and ends 'cancelled' (no
-- retry). A failed or discarded job that halts its key is cancelled too, and the halt ends. The
-- status is re-checked on the row written: a job claimed meanwhile gets the request instead, a
-- job that finished meanwhile is left alone. A keyed job cancelled at once lets its key go on:
-- admin.py promotes the key's next job (ordering_promote_keys) on the keys this returns, once
-- this commits. Same shape as admin_jobs_retry.
WITH changed AS (
    UPDATE dispatcher_jobs AS j
       SET status = CASE WHEN j.status = 'running' THEN j.status ELSE 'cancelled' END,
           ordering_halted = false,
           cancel_requested_at = coalesce(j.cancel_requested_at, now()),
           updated_at = CASE WHEN j.status = 'running' THEN j.updated_at ELSE now() END
     WHERE j.id = ANY(%(ids)s::bigint[])
       AND CASE WHEN j.status IN ('queued', 'running', 'waiting', 'blocked') OR j.ordering_halted THEN {filters}
                ELSE false END
    RETURNING j.id, j.status, j.queue_name, j.ordering_key
)
SELECT id, NULL, NULL, status, NULL, NULL, queue_name, ordering_key FROM changed
UNION ALL
SELECT t.id, j.status, coalesce({filters}, false), NULL, false, j.ordering_halted, NULL, NULL
  FROM unnest(%(ids)s::bigint[]) AS t(id)
  LEFT JOIN dispatcher_jobs AS j ON j.id = t.id

-- name: admin_jobs_purge
-- Delete finished jobs (completed, failed, discarded, cancelled) among %(ids)s that still match
-- the filters, in the jobs table and in the archive of completed jobs; live ones are never
-- touched (re-checked on the row deleted). Their attempt history stays until
-- history_retention_s. A purged job that halted its key lets the key go on (admin.py promotes its
-- next job, as for a cancel). Same shape as admin_jobs_retry. A purged job with a uniqueness
-- window leaves its finish time in it ({close_windows}, sql/dedupe.sql).
WITH changed AS (
    DELETE FROM dispatcher_jobs AS j
     WHERE j.id = ANY(%(ids)s::bigint[])
       AND CASE WHEN j.status IN ('completed', 'failed', 'discarded', 'cancelled') THEN {filters} ELSE false END
    RETURNING j.id, j.queue_name, CASE WHEN j.ordering_halted THEN j.ordering_key END AS ordering_key,
              j.dedupe_key, j.dedupe_window_s, j.updated_at AS finished_at
),
archived AS (
    DELETE FROM dispatcher_jobs_archive AS j
     WHERE j.id = ANY(%(ids)s::bigint[]) AND {filters}
    RETURNING j.id, j.queue_name
),
gone AS (SELECT id, queue_name, dedupe_key, dedupe_window_s, finished_at FROM changed),
{close_windows}
SELECT id, NULL, NULL, 'purged', NULL, NULL, queue_name, ordering_key FROM changed
UNION ALL
SELECT t.id, j.status, coalesce({filters}, false), NULL, false, j.ordering_halted, NULL, NULL
  FROM unnest(%(ids)s::bigint[]) AS t(id)
  LEFT JOIN (SELECT * FROM dispatcher_jobs AS h WHERE h.id = ANY(%(ids)s::bigint[])
             UNION ALL
             SELECT * FROM dispatcher_jobs_archive AS h WHERE h.id = ANY(%(ids)s::bigint[])) AS j ON j.id = t.id
UNION ALL
SELECT id, NULL, NULL, 'purged', NULL, NULL, queue_name, NULL FROM archived

-- name: admin_halted_keys
-- The keys that a failed or discarded job halts (ordering_halted), newest first (by the halted
-- job's id), at most %(limit)s: each with its halted job and how many jobs wait behind it. The
-- halted jobs are read through dispatcher_jobs_ordering_holder_idx (a key's holders only: one
-- row per key in use), the waiting count of each listed key through
-- dispatcher_jobs_ordering_waiting_idx, in the halted job's bucket (a key picks its jobs' bucket;
-- on a Citus cluster that makes the count a join on the distribution column).
SELECT j.queue_name, j.ordering_key, j.id, j.job_type, j.status, j.failed_at, j.last_error,
       (SELECT count(*) FROM dispatcher_jobs AS w
         WHERE w.bucket = j.bucket AND w.queue_name = j.queue_name AND w.ordering_key = j.ordering_key
           AND w.status = 'waiting') AS waiting
  FROM dispatcher_jobs AS j
 WHERE j.ordering_key IS NOT NULL AND j.ordering_halted AND {filters}
 ORDER BY j.id DESC
 LIMIT %(limit)s

-- The workers' role's privileges (dispatcher/db/privileges.py, `dispatcher grants`): a script the
-- tables' owner runs. {placeholders}: quoted identifiers and privilege lists, filled in by code.

-- name: grant_schema_usage
GRANT USAGE ON SCHEMA {schema} TO {role}

-- name: grant_table
GRANT {privileges} ON TABLE {table} TO {role}

-- name: grant_sequence
GRANT {privileges} ON SEQUENCE {sequence} TO {role}

-- name: grant_function
-- A function by its name alone: each of ours has one signature.
GRANT {privileges} ON FUNCTION {function} TO {role}
