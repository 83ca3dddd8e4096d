-- Dependencies between jobs (dispatcher/db/dependencies.py, docs/concepts/workflows.md): a graph's
-- insert, the release of a finished parent's children, and the sweep that finds parents whose
-- release never ran. The rule they keep (a child runs only after every parent completed) and the
-- table that holds the pending edges: migrations/0017_composing_work.sql. Jobs without parents or
-- children never run these.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style.

-- name: deps_ids_take
-- Ids for a graph's jobs, taken before they are inserted: an edge names both of its jobs.
SELECT ARRAY(SELECT nextval('dispatcher_jobs_id_seq') FROM generate_series(1, %(n)s))

-- name: deps_parents_mark
-- The existing jobs a graph depends on, each marked as having dependents under its row lock, with
-- its status now. The lock is what keeps a parent's end and a child's enqueue apart: a parent that
-- completes first is read completed here (no edge is written); one that completes after waits for
-- this transaction, and its completion reads has_dependents and releases the edge written here.
UPDATE dispatcher_jobs AS p
   SET has_dependents = true
 WHERE p.id = ANY(%(ids)s::bigint[])
RETURNING p.id, p.bucket, p.status

-- name: deps_jobs_insert
-- A graph's jobs, one array element each, under the ids deps_ids_take gave: blocked while some
-- parent has not completed (pending_parents), else queued. The owners of the buckets that got
-- queued jobs are woken, as jobs_insert_one does (one NOTIFY per bucket).
WITH inserted AS (
    INSERT INTO dispatcher_jobs (id, queue_name, job_type, payload, priority, bucket, max_attempts,
                                 max_attempts_given, run_at, status, pending_parents, depends_on,
                                 has_dependents, batch_id, tags, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT u.id, u.queue_name, u.job_type, u.payload::jsonb, u.priority, u.bucket, coalesce(u.max_attempts, 20),
           u.max_attempts IS NOT NULL, coalesce(u.run_at, now()) + u.delay_s * interval '1 second',
           CASE WHEN coalesce(u.pending, 0) > 0 THEN 'blocked' ELSE 'queued' END, u.pending,
           u.depends_on::bigint[], u.has_dependents, u.batch_id, u.tags::text[], %(trace_context)s::jsonb
      FROM unnest(%(ids)s::bigint[], %(queues)s::text[], %(job_types)s::text[], %(payloads)s::text[],
                  %(priorities)s::smallint[], %(buckets)s::smallint[], %(max_attempts)s::int[],
                  %(run_ats)s::timestamptz[], %(delays_s)s::float8[], %(pendings)s::int[],
                  %(depends_on)s::text[], %(has_dependents)s::bool[], %(batch_ids)s::bigint[], %(tags)s::text[])
           AS u(id, queue_name, job_type, payload, priority, bucket, max_attempts, run_at, delay_s, pending,
                depends_on, has_dependents, batch_id, tags)
    RETURNING queue_name, bucket, status, ceil(1000 * extract(epoch FROM run_at - clock_timestamp()))::bigint AS due_in_ms
)
SELECT (SELECT count(*) FROM inserted),
       (SELECT count(pg_notify(%(channel)s, w.queue_name || ':' || w.bucket
                                            || CASE WHEN w.due_in_ms > 0 THEN ':' || w.due_in_ms ELSE '' END))
          FROM (SELECT queue_name, bucket, min(due_in_ms) AS due_in_ms
                  FROM inserted WHERE status = 'queued' GROUP BY queue_name, bucket) AS w)

-- name: deps_edges_insert
-- A graph's pending edges: parent -> child, with the child's policy for a parent that ends
-- without success.
INSERT INTO dispatcher_job_deps (parent_id, parent_bucket, child_id, child_bucket, on_parent_failure)
SELECT * FROM unnest(%(parent_ids)s::bigint[], %(parent_buckets)s::smallint[], %(child_ids)s::bigint[],
                     %(child_buckets)s::smallint[], %(policies)s::text[])

-- name: deps_release
-- Release the children of the parents %(ids)s, which ended (a completion, a final failure, a
-- cancel): each parent's edges go, and each child is counted down, in the same statement.
-- A completed parent (or one whose row is gone: deleted by its completion, or purged) satisfies
-- its edges. One that ended failed, discarded or cancelled satisfies the edges whose child runs
-- anyway ('run'), cancels the children that say 'cancel', and leaves the edges that say 'wait'
-- in place: they go when an operator retries the parent and it completes, or cancels the child.
-- A parent that has not ended (an operator retried it meanwhile) keeps its edges.
-- The count-down is an UPDATE of the child's row: two parents that end at once both count it
-- down, one after the other under its row lock, and the one that reaches 0 queues it (the
-- re-check on the row written, a CASE for the plan as in finish.sql, skips a child that is no
-- longer blocked: cancelled by an operator, or by a sibling edge). The children are joined by id
-- alone, no `id = ANY(...)` beside it: on a table without statistics yet (a graph enqueued just
-- now) that form scanned the whole CTE for every child (docs/design/dependencies.md). A child queued now is due from
-- now (its wait is counted from here) and its bucket's owner is woken; a batch's callback
-- (batch_id = id) gathers its members' outcomes into its payload's "batch" as they end.
-- Returns how many children became queued, the cancelled children that have children of their
-- own (released in turn by the caller), and the NOTIFYs sent. Anyone awaiting a cancelled child
-- (awaited) is told on %(results_channel)s.
WITH ended AS MATERIALIZED (
    SELECT r.id, coalesce(p.status, 'completed') AS status
      FROM unnest(%(ids)s::bigint[]) AS r(id)
      LEFT JOIN dispatcher_jobs AS p ON p.id = r.id
),
gone AS (
    DELETE FROM dispatcher_job_deps AS d
     USING ended AS e
     WHERE d.parent_id = ANY(%(ids)s::bigint[]) AND d.parent_id = e.id
       AND (e.status = 'completed'
            OR (e.status IN ('failed', 'discarded', 'cancelled') AND d.on_parent_failure <> 'wait'))
    RETURNING d.child_id, d.parent_id, e.status, e.status = 'completed' OR d.on_parent_failure = 'run' AS satisfied
),
children AS MATERIALIZED (
    SELECT g.child_id AS id, count(*)::int AS released,
           (array_agg(g.parent_id ORDER BY g.parent_id) FILTER (WHERE NOT g.satisfied))[1] AS culprit,
           (array_agg(g.status ORDER BY g.parent_id) FILTER (WHERE NOT g.satisfied))[1] AS culprit_status,
           count(*) FILTER (WHERE g.status = 'completed')::int AS n_completed,
           count(*) FILTER (WHERE g.status = 'failed')::int AS n_failed,
           count(*) FILTER (WHERE g.status = 'discarded')::int AS n_discarded,
           count(*) FILTER (WHERE g.status = 'cancelled')::int AS n_cancelled,
           now() AS now
      FROM gone AS g
     GROUP BY g.child_id
),
-- Every value the CASEs below write that is not a column is computed here: Citus refuses a CASE
-- that calls a function which is not immutable (as in finish.sql); the batch's counts are built
-- as text there for the same reason (jsonb_build_object is not immutable).
reasons AS MATERIALIZED (
    SELECT k.*, 'parent ' || k.culprit || ' ended ' || k.culprit_status AS culprit_error FROM children AS k
),
counted AS (
    UPDATE dispatcher_jobs AS c
       SET pending_parents = c.pending_parents - k.released,
           status = CASE WHEN k.culprit IS NOT NULL THEN 'cancelled'
                         WHEN c.pending_parents - k.released <= 0 THEN 'queued'
                         ELSE 'blocked' END,
           run_at = CASE WHEN k.culprit IS NULL AND c.pending_parents - k.released <= 0
                         THEN greatest(c.run_at, k.now) ELSE c.run_at END,
           last_error = CASE WHEN k.culprit IS NOT NULL THEN k.culprit_error ELSE c.last_error END,
           payload = CASE WHEN c.batch_id = c.id
                          THEN c.payload || ('{"batch": {"id": ' || c.id::text || ', "counts": {'
                               || '"completed": ' || (coalesce((c.payload #>> '{batch,counts,completed}')::int, 0) + k.n_completed)::text
                               || ', "failed": ' || (coalesce((c.payload #>> '{batch,counts,failed}')::int, 0) + k.n_failed)::text
                               || ', "discarded": ' || (coalesce((c.payload #>> '{batch,counts,discarded}')::int, 0) + k.n_discarded)::text
                               || ', "cancelled": ' || (coalesce((c.payload #>> '{batch,counts,cancelled}')::int, 0) + k.n_cancelled)::text
                               || '}}}')::jsonb
                          ELSE c.payload END,
           updated_at = k.now
      FROM reasons AS k
     WHERE c.id = k.id
       AND CASE WHEN c.status = 'blocked' THEN true ELSE false END
    RETURNING c.id, c.status, c.queue_name, c.bucket, c.has_dependents, c.awaited, c.run_at
)
SELECT (SELECT count(*) FROM counted WHERE status = 'queued'),
       ARRAY(SELECT id FROM counted WHERE status = 'cancelled' AND has_dependents),
       (SELECT count(pg_notify(%(channel)s, w.queue_name || ':' || w.bucket
                                            || CASE WHEN w.due_in_ms > 0 THEN ':' || w.due_in_ms ELSE '' END))
          FROM (SELECT queue_name, bucket,
                       min(ceil(1000 * extract(epoch FROM run_at - clock_timestamp())))::bigint AS due_in_ms
                  FROM counted WHERE status = 'queued' GROUP BY queue_name, bucket) AS w)
       + (SELECT count(pg_notify(%(results_channel)s, id || ':' || status))
            FROM counted WHERE status = 'cancelled' AND awaited)

-- name: deps_stranded
-- Parents whose edges should have been released and were not: the worker that ended them died
-- between its write and the release, or a child's enqueue committed while its parent was ending.
-- The dependency sweeper (runtime/dep_sweeper.py) releases them. Reads the pending edges only
-- (a table that holds the edges of unfinished graphs), each parent by primary key.
SELECT DISTINCT d.parent_id
  FROM dispatcher_job_deps AS d
  LEFT JOIN dispatcher_jobs AS p ON p.id = d.parent_id
 WHERE p.id IS NULL OR p.status = 'completed'
    OR (p.status IN ('failed', 'discarded', 'cancelled') AND d.on_parent_failure <> 'wait')
 LIMIT %(limit)s
