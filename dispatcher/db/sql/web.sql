-- The dashboard's own reads (dispatcher/web/); the rest of what it shows comes from the status,
-- admin, flow and schedule statements. Each is bounded by an index: docs/design/dashboard.md
-- gives what one refresh costs at 1M jobs.

-- name: web_recent_outcomes
-- Per queue, jobs that completed, and that failed or were discarded, in the last %(window_s)s
-- seconds: a range of dispatcher_jobs_completed_idx and of dispatcher_jobs_unsuccessful_idx by
-- updated_at (each row's queue from the heap), so the cost follows the rate, not the table; and
-- the archive's completed jobs (migration 0020), in its newest partitions by the BRIN on
-- completed_at. Under DISPATCHER_COMPLETED_JOBS=delete completed jobs leave no row: the page says so.
SELECT queue_name, count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status <> 'completed') AS failed
  FROM (SELECT queue_name, status FROM dispatcher_jobs
         WHERE status = 'completed' AND updated_at > now() - %(window_s)s * interval '1 second'
        UNION ALL
        SELECT queue_name, status FROM dispatcher_jobs_archive
         WHERE completed_at > now() - %(window_s)s * interval '1 second'
        UNION ALL
        SELECT queue_name, status FROM dispatcher_jobs
         WHERE status IN ('failed', 'discarded', 'cancelled')
           AND updated_at > now() - %(window_s)s * interval '1 second') AS recent
 WHERE status <> 'cancelled'
 GROUP BY queue_name

-- name: web_bucket_backlog
-- One queue's due jobs per bucket, each count stopped at %(cap)s: 64 ranges of
-- dispatcher_jobs_claim_bucket_idx (queue, bucket), at most %(cap)s entries read from each, so
-- a refresh reads at most 64 x %(cap)s entries, however deep the backlog.
SELECT b.bucket,
       (SELECT count(*) FROM (SELECT 1 FROM dispatcher_jobs AS j
                               WHERE j.status = 'queued' AND j.queue_name = %(queue)s AND j.bucket = b.bucket
                                 AND j.run_at <= now()
                               LIMIT %(cap)s) AS due) AS due
  FROM generate_series(0, 63) AS b(bucket)


-- name: web_serial_reads
-- The dashboard's reads in this transaction run without parallel workers: on these short
-- statements starting them costs more than they save (queue_depth at 1M jobs on 2 cores: 76 ms
-- with, 49 ms without; docs/design/dashboard.md), and the app's own queries keep them.
SET LOCAL max_parallel_workers_per_gather = 0

-- name: web_queue_names
-- The queues the bucket map offers: those with queued jobs, found by a skip scan of
-- dispatcher_jobs_claim_idx (one index probe per queue, however many jobs each holds), and those
-- with a coordination group.
WITH RECURSIVE queued(queue_name) AS (
    (SELECT queue_name FROM dispatcher_jobs WHERE status = 'queued' AND priority > -32769
      ORDER BY queue_name LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue_name FROM dispatcher_jobs AS j
             WHERE j.status = 'queued' AND j.priority > -32769 AND j.queue_name > q.queue_name
             ORDER BY j.queue_name LIMIT 1)
      FROM queued AS q
     WHERE q.queue_name IS NOT NULL
)
SELECT queue_name FROM queued WHERE queue_name IS NOT NULL
UNION
SELECT queue FROM dispatcher_bucket_owners WHERE owner IS NOT NULL
ORDER BY 1
