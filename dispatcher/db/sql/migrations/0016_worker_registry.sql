-- The worker registry: one row per worker process, whatever its mode (partitioned, skip_locked)
-- and coordinator (postgres, redis, static), written by its presence heartbeat
-- (dispatcher/runtime/presence.py) every few seconds. `dispatcher status`, the dashboard's workers
-- page and the dispatcher_workers gauge read it. A worker is live while expires_at is ahead of the
-- database clock and it has not said it stopped; a killed one leaves the live view when its lease
-- runs out. Rows stay DISPATCHER_UNSERVED_TYPE_DISCARD_S (1 h) after a worker was last seen: they
-- tell which job types were served lately, so that a type no worker has served for that long is
-- discarded (a rollout that adds a type fails none of its jobs), and which schedules the newest
-- workers declare (a schedule added by a release starts whichever pod holds the queue's lease).
--
-- One transaction: a new table, no lock on the jobs.
SET LOCAL lock_timeout = '5s';

CREATE TABLE IF NOT EXISTS dispatcher_workers (
    worker_id   text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    version     text        NOT NULL,
    mode        text        NOT NULL,
    coordinator text        NOT NULL,
    queues      text[]      NOT NULL,
    job_types   text[]      NOT NULL,
    -- {queue: {schedule name: fingerprint}} of the schedules this worker declares
    schedules   jsonb       NOT NULL DEFAULT '{}',
    concurrency integer     NOT NULL,
    running     integer     NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    stopped_at  timestamptz
);
