-- Flow control for the whole fleet (docs/concepts/flow-control.md): limits per job type and queue,
-- and paused queues, kept in the database so that every worker agrees and a change needs no deploy.
--
-- Every claim statement compares the worker's copy of these tables with `version`, bumped by every
-- change in the same transaction: a claim made with an old copy claims nothing and the worker reads
-- them again, so a pause or a new limit holds from the moment it commits, not when each worker next
-- looks. Jobs of limited types are claimed only by a claim that first locks their limit rows, so
-- `max_running` is counted from the jobs table itself (status 'running') under that lock: a dead
-- worker's slots come back with its leases and nothing drifts. New tables only: nothing is rewritten.

CREATE TABLE IF NOT EXISTS dispatcher_flow_control (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint  NOT NULL DEFAULT 0
);
INSERT INTO dispatcher_flow_control (singleton, version) VALUES (true, 0) ON CONFLICT DO NOTHING;

-- '*' in job_type or queue_name: every type, every queue. A job counts against each row that
-- matches it (its type or '*', its queue or '*').
CREATE TABLE IF NOT EXISTS dispatcher_limits (
    job_type     text NOT NULL CHECK (job_type <> ''),
    queue_name   text NOT NULL DEFAULT '*' CHECK (queue_name <> ''),
    max_running  integer CHECK (max_running >= 0),
    per_second   double precision CHECK (per_second > 0 AND per_second <= 1000000),
    -- The token bucket of per_second: at most `burst_jobs` start at once after a quiet spell.
    burst_jobs   double precision NOT NULL DEFAULT 1 CHECK (burst_jobs >= 1),
    tokens       double precision NOT NULL DEFAULT 0,
    refilled_at  timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_type, queue_name),
    CHECK (max_running IS NOT NULL OR per_second IS NOT NULL)
);

CREATE TABLE IF NOT EXISTS dispatcher_paused_queues (
    queue_name text PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now()
);
