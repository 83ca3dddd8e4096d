-- Every attempt's error on the job (River's `errors[]`, Oban's `errors`): a JSON array of
-- {"attempt", "at", "error"} objects, the last ATTEMPT_ERRORS_KEPT of them (dispatcher/constants.py),
-- each error cut to ATTEMPT_ERROR_MAX_CHARS (its head and its tail: a traceback's last line names the
-- exception). Written only by the statement that records a failed attempt (jobs_fail_owned: handler
-- errors, timeouts, lease expiries, cancels), never by a claim or a completion: a job that succeeds
-- first time leaves it NULL, a bit in the row's null bitmap. last_error stays the newest one.
--
-- One transaction: a nullable column without a default is a catalog change, milliseconds of
-- ACCESS EXCLUSIVE and no row rewritten, bounded by lock_timeout as in 0007.
SET LOCAL lock_timeout = '5s';

ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS errors jsonb;
