-- The charts' rollup (docs/design/dashboard.md, "Charts: the per-minute rollup"): the stats
-- flusher and the rollup of runtime/queue_stats.py write it, web/chart_reads.py reads it.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Never reads the jobs table but for the depth sample (queue_depth, once a minute).

-- name: stats_flush_bound
-- The flush's own bound, on the server, shorter than the client's: a flush that overruns is
-- cancelled by the server before the worker gives up on it, so it cannot commit after the worker
-- kept its counts for the next flush (no double count). Local to the flush's transaction.
SELECT set_config('statement_timeout', %(statement)s, true)

-- name: stats_flush
-- Add a worker's counts since its last flush to its row of the current minute (the database's
-- clock), one row per queue: %(queues)s, %(finished)s, %(failed)s, %(wait_sums)s and %(waits)s
-- (bigint[] literals, one per queue) in step. Touches only this worker's rows: flushes of
-- different workers never wait for one another.
INSERT INTO dispatcher_stats_by_worker AS s
       (minute, queue_name, worker_id, finished, failed, waits, wait_sum_s)
SELECT date_trunc('minute', now()), q.queue_name, %(worker_id)s, q.finished, q.failed,
       q.waits::bigint[], q.wait_sum_s
  FROM unnest(%(queues)s::text[], %(finished)s::bigint[], %(failed)s::bigint[],
              %(waits)s::text[], %(wait_sums)s::float8[])
       AS q(queue_name, finished, failed, waits, wait_sum_s)
ON CONFLICT (minute, queue_name, worker_id) DO UPDATE
   SET finished = s.finished + excluded.finished,
       failed = s.failed + excluded.failed,
       waits = ARRAY(SELECT coalesce(a, 0) + coalesce(b, 0)
                       FROM unnest(s.waits, excluded.waits) WITH ORDINALITY AS u(a, b, i)
                      ORDER BY i),
       wait_sum_s = s.wait_sum_s + excluded.wait_sum_s

-- name: stats_rollup
-- Move every closed minute (before the current one, by the database's clock) of every worker
-- into the per-minute table, adding to what is there (a late flush of a minute already rolled
-- lands in the next rollup): the workers' rows of one to two minutes, whoever wrote them,
-- including a worker that died since. Histograms add element-wise. Each minute also gets a row
-- of every queue summed, queue_name '' (no queue has that name): the overview's charts read
-- 1,440 rows for 24 h whatever the number of queues, not 1,440 per queue.
WITH moved AS (
    DELETE FROM dispatcher_stats_by_worker
     WHERE minute < date_trunc('minute', now())
    RETURNING minute, queue_name, finished, failed, waits, wait_sum_s
), totals AS (
    SELECT minute, coalesce(queue_name, '') AS queue_name, sum(finished) AS finished,
           sum(failed) AS failed, sum(wait_sum_s) AS wait_sum_s
      FROM moved
     GROUP BY GROUPING SETS ((minute, queue_name), (minute))
), buckets AS (
    SELECT m.minute, coalesce(m.queue_name, '') AS queue_name, u.i, sum(u.n) AS n
      FROM moved AS m, unnest(m.waits) WITH ORDINALITY AS u(n, i)
     GROUP BY GROUPING SETS ((m.minute, m.queue_name, u.i), (m.minute, u.i))
), histograms AS (
    SELECT minute, queue_name, array_agg(n::bigint ORDER BY i) AS waits
      FROM buckets
     GROUP BY minute, queue_name
)
INSERT INTO dispatcher_stats_by_minute AS s (minute, queue_name, finished, failed, waits, wait_sum_s)
SELECT t.minute, t.queue_name, t.finished, t.failed, h.waits, t.wait_sum_s
  FROM totals AS t LEFT JOIN histograms AS h USING (minute, queue_name)
ON CONFLICT (minute, queue_name) DO UPDATE
   SET finished = s.finished + excluded.finished,
       failed = s.failed + excluded.failed,
       waits = CASE WHEN s.waits IS NULL THEN excluded.waits
                    WHEN excluded.waits IS NULL THEN s.waits
                    ELSE ARRAY(SELECT coalesce(a, 0) + coalesce(b, 0)
                                 FROM unnest(s.waits, excluded.waits) WITH ORDINALITY AS u(a, b, i)
                                ORDER BY i) END,
       wait_sum_s = s.wait_sum_s + excluded.wait_sum_s
RETURNING s.minute

-- name: stats_record_depth
-- The depth sample of each queue for the current minute (due queued jobs, from queue_depth), and
-- their sum under queue_name '' (every queue). A queue with rows in the last hour but none
-- queued now (queue_depth has no row for it) is sampled at 0, so a drained queue's line goes
-- down to 0 instead of stopping.
WITH sampled AS (
    SELECT d.queue_name, d.depth
      FROM unnest(%(queues)s::text[], %(depths)s::bigint[]) AS d(queue_name, depth)
    UNION
    SELECT m.queue_name, 0
      FROM dispatcher_stats_by_minute AS m
     WHERE m.minute >= now() - interval '1 hour' AND m.queue_name <> ''
       AND m.queue_name <> ALL(%(queues)s::text[])
)
INSERT INTO dispatcher_stats_by_minute AS s (minute, queue_name, depth)
SELECT date_trunc('minute', now()), coalesce(queue_name, ''), sum(depth)
  FROM sampled
 GROUP BY GROUPING SETS ((queue_name), ())
HAVING count(*) > 0
ON CONFLICT (minute, queue_name) DO UPDATE SET depth = excluded.depth

-- name: stats_retention
-- Per-minute rows older than %(keep_s)s (7 days): a minute's worth per queue each round, by the
-- primary key's leading minute.
DELETE FROM dispatcher_stats_by_minute
 WHERE minute < now() - %(keep_s)s * interval '1 second'

-- name: stats_anchor
-- The start of the chart's last point (now, on the database's clock, floored to %(step_s)s) and
-- the seconds of it gone by: that point is still filling.
SELECT to_timestamp(floor(extract(epoch FROM now()) / %(step_s)s) * %(step_s)s) AS anchor,
       (extract(epoch FROM now()) - floor(extract(epoch FROM now()) / %(step_s)s) * %(step_s)s)::float8
         AS elapsed_s

-- name: stats_series
-- A chart's points from %(since)s on, each %(step_s)s long: the rolled-up minutes and the
-- workers' rows not rolled yet (a minute or two), of one queue or, %(queue)s NULL, of all of
-- them (the rollup's '' rows). Counts and histograms add up; the largest depth sample of a
-- point is kept (NULL: never sampled in it). Reads the primary keys' ranges only: at most 1,440
-- rolled-up rows for 24 h, plus the workers' rows of the last minute or two.
WITH picked AS (
    SELECT minute, finished, failed, waits, depth
      FROM dispatcher_stats_by_minute
     WHERE minute >= %(since)s AND queue_name = coalesce(%(queue)s::text, '')
    UNION ALL
    SELECT minute, finished, failed, waits, NULL
      FROM dispatcher_stats_by_worker
     WHERE minute >= %(since)s AND (%(queue)s::text IS NULL OR queue_name = %(queue)s::text)
), minutes AS (
    SELECT to_timestamp(floor(extract(epoch FROM minute) / %(step_s)s) * %(step_s)s) AS at,
           sum(finished) AS finished, sum(failed) AS failed, sum(depth) AS depth
      FROM picked
     GROUP BY minute
), points AS (
    SELECT at, sum(finished)::bigint AS finished, sum(failed)::bigint AS failed,
           max(depth)::bigint AS depth
      FROM minutes
     GROUP BY at
), buckets AS (
    SELECT to_timestamp(floor(extract(epoch FROM p.minute) / %(step_s)s) * %(step_s)s) AS at,
           u.i, sum(u.n) AS n
      FROM picked AS p, unnest(p.waits) WITH ORDINALITY AS u(n, i)
     GROUP BY 1, 2
), histograms AS (
    SELECT at, array_agg(n::bigint ORDER BY i) AS waits FROM buckets GROUP BY at
)
SELECT p.at, p.finished, p.failed, p.depth, h.waits
  FROM points AS p LEFT JOIN histograms AS h USING (at)
 ORDER BY p.at
