-- The dashboard's own reads (dispatcher/web/); the rest of what it shows comes from the status,
-- admin, flow and schedule statements. Each is bounded by an index: docs/design/dashboard.md
-- gives what one refresh costs at 1M jobs.

-- name: web_recent_outcomes
-- Per queue, jobs that completed, and that failed or were discarded, in the last %(window_s)s
-- seconds: a range of dispatcher_jobs_completed_idx and of dispatcher_jobs_unsuccessful_idx by
-- updated_at (each row's queue from the heap), so the cost follows the rate, not the table. Under
-- DISPATCHER_COMPLETED_JOBS=delete completed jobs leave no row: the page says so.
SELECT queue_name, count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status <> 'completed') AS failed
  FROM (SELECT queue_name, status FROM dispatcher_jobs
         WHERE status = 'completed' AND updated_at > now() - %(window_s)s * interval '1 second'
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

