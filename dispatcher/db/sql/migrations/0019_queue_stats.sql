-- The dashboard's charts (docs/design/dashboard.md, "Charts: the per-minute rollup"): per queue and
-- minute, the attempts finished and failed, a histogram of queue waits (due to claimed), and a
-- sample of the queue's depth. Never read from the jobs table, so they hold under
-- DISPATCHER_COMPLETED_JOBS=delete.
--
-- dispatcher_stats_by_worker: each worker adds what it counted in memory every few seconds
-- (runtime/queue_stats.py, the stats flusher) to its own row of the current minute (the
-- database's clock). A handful of rows per worker and queue: the rollup moves every closed minute.
-- dispatcher_stats_by_minute: one row per minute and queue, written by the rollup (one pod, the
-- `stats` maintenance lease) about once a minute, kept 7 days (10,080 rows per queue).
-- `waits`: counts per bucket of dispatcher.observe.job_metrics.WAIT_BUCKETS_S, the last one for
-- waits above the largest bound (a change of those bounds needs a migration of these arrays).
-- Plain tables: on a Citus cluster they stay local to the coordinator, where the workers' and
-- the dashboard's statements go.
--
-- One transaction: new tables, no lock on the jobs.
SET LOCAL lock_timeout = '5s';

CREATE TABLE IF NOT EXISTS dispatcher_stats_by_worker (
    minute      timestamptz NOT NULL,
    queue_name  text        NOT NULL,
    worker_id   text        NOT NULL,
    finished    bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    waits       bigint[]    NOT NULL,
    wait_sum_s  float8      NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue_name, worker_id)
);

CREATE TABLE IF NOT EXISTS dispatcher_stats_by_minute (
    minute      timestamptz NOT NULL,
    queue_name  text        NOT NULL,
    finished    bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    waits       bigint[],
    wait_sum_s  float8      NOT NULL DEFAULT 0,
    -- due queued jobs when the rollup sampled the queue in this minute (NULL: not sampled)
    depth       bigint,
    PRIMARY KEY (minute, queue_name)
);
