-- Recurring jobs (docs/concepts/schedules.md): schedules declared with the handlers, whose jobs are
-- enqueued ahead by one worker per queue at a time (the holder of the queue's `schedules:<queue>`
-- maintenance lease), exactly once per slot across the fleet.
--
-- Exactly once is the database's rule, not a process's memory: a job is enqueued for a slot only
-- in the transaction that inserts the slot's row into dispatcher_schedule_runs, whose primary key
-- is (schedule_name, slot_at). Two holders (a lease that ran out mid-round) can both try; one
-- inserts, the other's insert does nothing and it enqueues nothing.
--
-- Step 1, one transaction: new tables, and a nullable column on dispatcher_jobs (a catalog change,
-- milliseconds of ACCESS EXCLUSIVE, no row rewritten), bounded by lock_timeout as in 0007.
SET LOCAL lock_timeout = '5s';

-- The slot a scheduled job was enqueued for (`job.scheduled_for`); NULL for every other job.
ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS scheduled_for timestamptz;

-- One row per schedule, as the last holder of its queue's lease declared it.
CREATE TABLE IF NOT EXISTS dispatcher_schedules (
    name            text        PRIMARY KEY CHECK (name <> ''),
    queue_name      text        NOT NULL,
    job_type        text        NOT NULL,
    -- What `schedules list` shows: the cron expression, or 'every 30s'.
    cadence         text        NOT NULL,
    time_zone       text        NOT NULL,
    catch_up        text        NOT NULL CHECK (catch_up IN ('latest', 'all', 'none')),
    -- The declaration's fingerprint (cadence, time zone, job settings): a holder that declares
    -- another one replaces the slots enqueued ahead and goes on from the new cadence's next slot.
    fingerprint     text        NOT NULL,
    -- The cursor: the earliest slot not yet decided (enqueued or skipped); it only moves forward.
    next_slot_at    timestamptz NOT NULL,
    declared_at     timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- When the latest job of the schedule completed; NULL until one has.
    last_success_at timestamptz,
    -- Set when the holder of the queue's lease no longer declares it: it enqueues nothing more.
    removed_at      timestamptz
);

-- One row per slot that got a job: the unique slot key, and the run's outcome once it ended.
CREATE TABLE IF NOT EXISTS dispatcher_schedule_runs (
    schedule_name text        NOT NULL,
    slot_at       timestamptz NOT NULL,
    job_id        bigint,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL while the job is live; then its final status ('completed', 'failed', 'discarded',
    -- 'cancelled'), or 'gone' for a job deleted before a round saw it end.
    outcome       text,
    finished_at   timestamptz,
    PRIMARY KEY (schedule_name, slot_at)
);

-- The runs whose job has not ended yet, which each round looks up: a handful of rows.
CREATE INDEX IF NOT EXISTS dispatcher_schedule_runs_open_idx
    ON dispatcher_schedule_runs (job_id) WHERE outcome IS NULL;
