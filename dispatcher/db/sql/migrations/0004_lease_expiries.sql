-- How many times a job's lease ran out (its worker died or stalled). The reaper counts it so a
-- job that keeps killing its worker ends `failed` with "lease expired N times" instead of being
-- taken by the next worker at once, fleet-wide. A constant default: no table rewrite.
ALTER TABLE dispatcher_jobs ADD COLUMN lease_expiries integer NOT NULL DEFAULT 0;
