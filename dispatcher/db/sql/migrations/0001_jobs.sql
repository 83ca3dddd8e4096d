-- The jobs table and the indexes the claim, the reaper and the operators need.

CREATE TABLE dispatcher_jobs (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_name       text        NOT NULL DEFAULT 'default',
    job_type         text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status           text        NOT NULL DEFAULT 'queued'
                     CONSTRAINT dispatcher_jobs_status_check
                     CHECK (status IN ('queued', 'running', 'completed', 'failed', 'discarded')),
    -- Smaller runs first (0 is the default; -10 jumps the line), as in River and Oban.
    priority         smallint    NOT NULL DEFAULT 0,
    -- 64 buckets = dispatcher.constants.NUM_BUCKETS; a worker polls only the buckets it owns.
    bucket           smallint    NOT NULL
                     CONSTRAINT dispatcher_jobs_bucket_check CHECK (bucket BETWEEN 0 AND 63),
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 20 CHECK (max_attempts >= 1),
    run_at           timestamptz NOT NULL DEFAULT now(),
    locked_at        timestamptz,
    -- Which worker holds (or last held) the job: for people. lock_token is the fence for code:
    -- a fresh uuid per claim statement, required to match on every completion and heartbeat.
    locked_by        text,
    lock_token       uuid,
    lease_expires_at timestamptz,
    completed_at     timestamptz,
    failed_at        timestamptz,
    last_error       text,
    dedupe_key       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
)
-- A job row is rewritten 2-3 times in its life (claim, complete, maybe retry) and then deleted:
-- fillfactor 70 leaves room on the page for those new versions, and vacuum at 1% dead rows
-- (not the stock 20%) with no cost delay keeps the runnable-row indexes short during a drain
-- of 200k jobs instead of letting 40k dead entries pile up in front of the claim.
WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Partitioned claim: one ordered index range per (queue, bucket); partial on runnable rows so
-- finished rows never sit in the claim's path.
CREATE INDEX dispatcher_jobs_claim_bucket_idx
    ON dispatcher_jobs (queue_name, bucket, priority, run_at, id) WHERE status = 'queued';

-- SKIP LOCKED claim: one ordered range per queue.
CREATE INDEX dispatcher_jobs_claim_idx
    ON dispatcher_jobs (queue_name, priority, run_at, id) WHERE status = 'queued';

-- Reaper: running jobs whose lease ran out.
CREATE INDEX dispatcher_jobs_lease_idx
    ON dispatcher_jobs (lease_expires_at) WHERE status = 'running';

-- Operators: recent failures.
CREATE INDEX dispatcher_jobs_failed_idx
    ON dispatcher_jobs (queue_name, failed_at) WHERE status = 'failed';

-- At most one live (queued or running) job per dedupe key and queue.
CREATE UNIQUE INDEX dispatcher_jobs_dedupe_idx
    ON dispatcher_jobs (queue_name, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running');

-- Optional execution history (DISPATCHER_HISTORY=true): one row per finished attempt.
-- Off by default: it costs an insert per job on the hot path.
CREATE TABLE dispatcher_job_attempts (
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker      text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    duration_ms double precision NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN ('completed', 'retried', 'failed', 'discarded', 'released')),
    error       text
);
CREATE INDEX dispatcher_job_attempts_job_idx ON dispatcher_job_attempts (job_id, attempt);
