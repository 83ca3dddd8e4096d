-- Ordering keys (dispatcher/db/store.py, dispatcher/api/enqueue.py, dispatcher/admin.py): the
-- statements that enqueue keyed jobs, end a key's holder and promote the key's next job, and find
-- keys left with waiting jobs and no holder. The rule they keep and the index that enforces it:
-- migrations/0008_ordering_keys.sql. Jobs without a key never run these: their enqueue and
-- completion are the plain statements of enqueue.sql and finish.sql.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces name fragments, filled in
-- by dispatcher/db/queries.py (see _FRAGMENTS there), or the completion, filled in by the store.

-- name: ordering_next_jobs
-- A fragment: the CTE `nexts`, for a statement that has defined `released(queue_name,
-- ordering_key)`, the keys whose holder it just ended: each key's next job, the lowest id among its
-- waiting jobs. No other statement can promote a key whose holder this statement ends: they all
-- require that the key has no holder, and until this statement commits it has one.
nexts AS MATERIALIZED (
    SELECT nxt.id, nxt.queue_name, nxt.bucket, nxt.priority, nxt.run_at, nxt.job_type
      FROM (SELECT DISTINCT r.queue_name, r.ordering_key FROM released AS r WHERE r.ordering_key IS NOT NULL) AS k
     CROSS JOIN LATERAL (
           SELECT n.id, n.queue_name, n.bucket, n.priority, n.run_at, n.job_type
             FROM dispatcher_jobs AS n  -- dispatcher_jobs_ordering_waiting_idx
            WHERE n.queue_name = k.queue_name AND n.ordering_key = k.ordering_key AND n.status = 'waiting'
            ORDER BY n.id
            LIMIT 1) AS nxt
)

-- name: ordering_queue_jobs
-- A fragment: the CTEs `promoted` and `woken`, for a statement that has defined `to_queue(id)`:
-- those waiting jobs become queued, and the owner of each one's bucket is woken (its due time
-- rides along, as in jobs_insert_one): one NOTIFY per bucket, whatever the number of jobs in it.
-- The waiting row is re-checked on the row written (a CASE, for the reason in finish.sql): one an
-- operator cancelled meanwhile is skipped, and its key is left to ordering_promote_scan.
promoted AS (
    UPDATE dispatcher_jobs AS w
       SET status = 'queued',
           updated_at = now()
     WHERE w.id = ANY(ARRAY(SELECT id FROM to_queue))
       AND CASE WHEN w.status = 'waiting' THEN true ELSE false END
    RETURNING w.queue_name, w.bucket, ceil(1000 * extract(epoch FROM w.run_at - clock_timestamp()))::bigint AS due_in_ms
),
woken AS (
    SELECT (SELECT count(*) FROM promoted) AS promoted,
           count(pg_notify(%(channel)s, p.queue_name || ':' || p.bucket
                                        || CASE WHEN p.due_in_ms > 0 THEN ':' || p.due_in_ms ELSE '' END)) AS notified
      FROM (SELECT queue_name, bucket, min(due_in_ms) AS due_in_ms
              FROM promoted GROUP BY queue_name, bucket) AS p
)

-- name: ordering_promote_next
-- A fragment: after `released` (ordering_next_jobs), each released key's next job becomes queued
-- and its bucket's owner is woken. Defines `promoted` and `woken`.
{next_jobs},
to_queue AS (SELECT id FROM nexts),
{queue_jobs}

-- name: jobs_insert_one_keyed
-- jobs_insert_one for a job with an ordering key. It becomes its key's holder (queued) if the key
-- has none and no job waits for it; else it waits behind them (status 'waiting', no NOTIFY: it is
-- not claimable yet). The first INSERT's ON CONFLICT is the holder index (or the dedupe index:
-- then the second INSERT meets the same conflict and nothing is inserted). A concurrent enqueue
-- of the same key waits for ours at that index, so two never both become holders. Ids are taken
-- in statement order, so a key's waiting jobs are in enqueue order. The id is drawn in `new`, not
-- by the column's default: Citus pushes an INSERT ... SELECT down to the shard's node, whose
-- identity range (node group << 48) is not in enqueue order with the coordinator's.
WITH new AS (SELECT nextval('dispatcher_jobs_id_seq') AS id),
head AS (
    INSERT INTO dispatcher_jobs (id, queue_name, job_type, payload, priority, bucket, max_attempts,
                                 max_attempts_given, run_at, dedupe_key, ordering_key, dedupe_window_s, trace_context,
                                 tags)
    OVERRIDING SYSTEM VALUE
    SELECT new.id, %(queue)s, %(job_type)s, %(payload)s, %(priority)s, %(bucket)s, coalesce(%(max_attempts)s::int, 20),
           %(max_attempts)s::int IS NOT NULL,
           coalesce(%(run_at)s::timestamptz, now()) + %(delay_s)s * interval '1 second', %(dedupe_key)s,
           %(ordering_key)s, %(dedupe_window_s)s, %(trace_context)s::jsonb, %(tags)s::text[]
      FROM new
     WHERE NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS w  -- in the key's bucket: one shard on Citus
                        WHERE w.bucket = %(bucket)s::smallint AND w.queue_name = %(queue)s
                          AND w.ordering_key = %(ordering_key)s AND w.status = 'waiting')
    ON CONFLICT DO NOTHING
    RETURNING id, run_at, status
),
behind AS (  -- only one of head and behind inserts: they share the id
    INSERT INTO dispatcher_jobs (id, queue_name, job_type, payload, priority, bucket, max_attempts,
                                 max_attempts_given, run_at, dedupe_key, ordering_key, dedupe_window_s, trace_context,
                                 tags, status)
    OVERRIDING SYSTEM VALUE
    SELECT new.id, %(queue)s, %(job_type)s, %(payload)s, %(priority)s, %(bucket)s, coalesce(%(max_attempts)s::int, 20),
           %(max_attempts)s::int IS NOT NULL,
           coalesce(%(run_at)s::timestamptz, now()) + %(delay_s)s * interval '1 second', %(dedupe_key)s,
           %(ordering_key)s, %(dedupe_window_s)s, %(trace_context)s::jsonb, %(tags)s::text[], 'waiting'
      FROM new
     WHERE NOT EXISTS (SELECT 1 FROM head)
    ON CONFLICT DO NOTHING  -- only the live dedupe index can conflict; untargeted, as 0014 reshaped it
    RETURNING id, run_at, status
)
SELECT id, CASE WHEN status = 'queued'
                THEN pg_notify(%(channel)s, %(notify)s || CASE WHEN due_in_ms > 0 THEN ':' || due_in_ms ELSE '' END)
           END
  FROM (SELECT id, status, ceil(1000 * extract(epoch FROM run_at - clock_timestamp()))::bigint AS due_in_ms
          FROM head
         UNION ALL
        SELECT id, status, ceil(1000 * extract(epoch FROM run_at - clock_timestamp()))::bigint
          FROM behind) AS i

-- name: jobs_stage_publish_keyed
-- jobs_stage_publish when some staged rows have an ordering key. `firsts`: each key's first staged
-- row that is not a live duplicate (in its bucket, as the dedupe index has it); `heads`: those
-- that became their key's holder (the key had none and no job waits for it; ON CONFLICT as in
-- jobs_insert_one_keyed). The rest go in, in staged order: keyed rows waiting, the others queued.
-- Every keyed row of `rest` reads `heads` first, so a key's holder has its lowest id. Returns how
-- many rows were inserted. Every row gets the enqueuing span's trace context (the trace_context
-- parameter), as jobs_stage_publish.
WITH firsts AS MATERIALIZED (
    SELECT DISTINCT ON (s.queue_name, s.ordering_key) s.*
      FROM dispatcher_jobs_stage_v3 AS s
     WHERE s.ordering_key IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS w
                        WHERE w.bucket = s.bucket AND w.queue_name = s.queue_name
                          AND w.ordering_key = s.ordering_key AND w.status = 'waiting')
       AND (s.dedupe_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM dispatcher_jobs AS d
                WHERE d.queue_name = s.queue_name AND d.dedupe_key = s.dedupe_key
                  AND d.status IN ('queued', 'running', 'waiting')))
     ORDER BY s.queue_name, s.ordering_key, s.n
),
heads AS (
    INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given,
                                 run_at, dedupe_key, ordering_key, dedupe_window_s, trace_context, tags)
    SELECT queue_name, job_type, payload, priority, bucket, coalesce(max_attempts, 20), max_attempts IS NOT NULL,
           run_at, dedupe_key, ordering_key, dedupe_window_s, %(trace_context)s::jsonb, tags
      FROM firsts
     ORDER BY n
    ON CONFLICT DO NOTHING
    RETURNING queue_name, ordering_key
),
rest AS (
    INSERT INTO dispatcher_jobs (queue_name, job_type, payload, priority, bucket, max_attempts, max_attempts_given,
                                 run_at, dedupe_key, ordering_key, dedupe_window_s, trace_context, tags, status)
    SELECT s.queue_name, s.job_type, s.payload, s.priority, s.bucket, coalesce(s.max_attempts, 20),
           s.max_attempts IS NOT NULL, s.run_at, s.dedupe_key, s.ordering_key, s.dedupe_window_s,
           %(trace_context)s::jsonb, s.tags, CASE WHEN s.ordering_key IS NULL THEN 'queued' ELSE 'waiting' END
      FROM dispatcher_jobs_stage_v3 AS s
     WHERE s.ordering_key IS NULL
        OR s.n NOT IN (SELECT f.n FROM firsts AS f JOIN heads AS h USING (queue_name, ordering_key))
     ORDER BY s.n
    ON CONFLICT DO NOTHING  -- only the live dedupe index can conflict; untargeted, as 0014 reshaped it
    RETURNING 1
)
SELECT (SELECT count(*) FROM heads) + (SELECT count(*) FROM rest)

-- name: ordering_chain_next
-- A fragment: jobs_complete_owned_keyed's CTEs after `released`. As ordering_promote_next, each
-- released key's next job is promoted, but a due one in a bucket the completing worker owns
-- (%(chain_queues)s, %(chain_buckets)s, pairwise) is claimed for it at once, up to
-- %(chain_limit)s of them (its free slots), in claim order: `chained` sets it running under a new
-- token and lease and returns it, as jobs_claim does. That worker is the one that would claim it
-- next anyway (it owns the bucket), so the key's next job starts one statement and one wake-up
-- sooner; partitioned mode passes its owned buckets, SKIP LOCKED mode (no owner) none. The others
-- become queued, and their buckets' owners are woken. A claim is a claim whoever makes it: the
-- unique holder index, not the bucket, keeps the key's jobs one at a time.
{next_jobs},
mine AS MATERIALIZED (
    SELECT x.id
      FROM nexts AS x
      JOIN unnest(%(chain_queues)s::text[], %(chain_buckets)s::smallint[]) AS o(queue_name, bucket)
        ON o.queue_name = x.queue_name AND o.bucket = x.bucket
     WHERE x.run_at <= now()
       -- Never a job of a paused queue or under a flow-control limit: those are claimed only by
       -- a gated claim (dispatcher/db/claims.py), which counts them. They become queued instead.
       AND NOT EXISTS (SELECT 1 FROM dispatcher_paused_queues AS p WHERE p.queue_name = x.queue_name)
       AND NOT EXISTS (SELECT 1 FROM dispatcher_limits AS l
                        WHERE l.job_type IN (x.job_type, '*') AND l.queue_name IN (x.queue_name, '*'))
     ORDER BY x.priority, x.run_at, x.id
     LIMIT %(chain_limit)s
),
chained AS (
    UPDATE dispatcher_jobs AS w
       SET status = 'running',
           attempts = w.attempts + 1,
           locked_at = now(),
           locked_by = %(worker)s,
           lock_token = %(token)s::uuid,
           lease_expires_at = now() + %(lease_s)s * interval '1 second',
           updated_at = now()
     WHERE w.id = ANY(ARRAY(SELECT id FROM mine))
       AND CASE WHEN w.status = 'waiting' THEN true ELSE false END
    RETURNING w.id, w.job_type, w.payload, w.attempts, CASE WHEN w.max_attempts_given THEN w.max_attempts END AS max_attempts,
              extract(epoch FROM w.locked_at)::float8 AS locked_at, w.bucket, w.priority, w.ordering_key,
              w.queue_name, date_part('epoch', w.locked_at - w.run_at) AS waited_s, w.trace_context
),
to_queue AS (SELECT id FROM nexts EXCEPT SELECT id FROM mine),
{queue_jobs}

-- name: jobs_complete_owned_keyed
-- A completion (jobs_complete_owned or jobs_complete_owned_delete, filled in as {completion} by
-- the store: the same fenced write) for a batch holding keyed jobs: each completed holder's key
-- promotes its next job, or claims it for this worker ({chain_next}). Returns one row per job
-- claimed, each with the number of rows completed, or one row of NULLs and that number; and the
-- ids it refused (fenced), as jobs_complete_owned_fenced; and, as that one, the completed jobs that
-- have dependents and a NOTIFY for each awaited one.
WITH released AS (
{completion}
    RETURNING j.id, j.queue_name, j.ordering_key, j.has_dependents, j.awaited
),
{chain_next}
SELECT c.id, c.job_type, c.payload, c.attempts, c.max_attempts, c.locked_at, c.bucket, c.priority, c.ordering_key,
       c.queue_name, (SELECT count(*) FROM released), w.promoted,
       ARRAY(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM released), c.waited_s, c.trace_context,
       ARRAY(SELECT id FROM released WHERE has_dependents),
       (SELECT count(pg_notify(%(results_channel)s, id || ':completed')) FROM released WHERE awaited)
  FROM woken AS w LEFT JOIN chained AS c ON true

-- name: ordering_promote_scan
-- Keys of one queue that have waiting jobs and no holder, promoted: up to %(limit)s keys after
-- %(after)s in key order (a loose scan of dispatcher_jobs_ordering_waiting_idx: two index
-- descents per key), so a sweep of many keys goes in pages. Such keys are rare: a keyed job
-- enqueued while its key's holder finished (the holder's statement could not see it yet), a
-- waiting job an operator cancelled at the moment it was to be promoted, or a worker of an
-- older release ending a holder. Returns the last key scanned (NULL: the end), and how many
-- keys were scanned and promoted.
WITH RECURSIVE scan AS (
    (SELECT w.ordering_key FROM dispatcher_jobs AS w
      WHERE w.queue_name = %(queue)s AND w.status = 'waiting' AND w.ordering_key > %(after)s
      ORDER BY w.ordering_key LIMIT 1)
    UNION ALL
    SELECT (SELECT w.ordering_key FROM dispatcher_jobs AS w
             WHERE w.queue_name = %(queue)s AND w.status = 'waiting' AND w.ordering_key > s.ordering_key
             ORDER BY w.ordering_key LIMIT 1)
      FROM scan AS s
     WHERE s.ordering_key IS NOT NULL
),
scanned AS (SELECT ordering_key FROM scan WHERE ordering_key IS NOT NULL LIMIT %(limit)s),
released AS (
    SELECT %(queue)s::text AS queue_name, k.ordering_key
      FROM scanned AS k
     WHERE NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS h  -- dispatcher_jobs_ordering_holder_idx
                        WHERE h.queue_name = %(queue)s AND h.ordering_key = k.ordering_key
                          AND (h.status IN ('queued', 'running') OR h.ordering_halted))
),
{promote_next}
SELECT CASE WHEN (SELECT count(*) FROM scanned) >= %(limit)s THEN (SELECT max(ordering_key) FROM scanned) END,
       (SELECT count(*) FROM scanned), (SELECT promoted FROM woken)

-- name: ordering_promote_keys
-- The same for given (queue, key) pairs: what an operator's retry, cancel or purge released
-- (dispatcher/admin.py runs it after the change commits). Returns how many were promoted.
WITH released AS (
    SELECT DISTINCT k.queue_name, k.ordering_key
      FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS k(queue_name, ordering_key)
     WHERE NOT EXISTS (SELECT 1 FROM dispatcher_jobs AS h
                        WHERE h.queue_name = k.queue_name AND h.ordering_key = k.ordering_key
                          AND (h.status IN ('queued', 'running') OR h.ordering_halted))
),
{promote_next}
SELECT promoted FROM woken
