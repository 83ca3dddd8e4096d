-- Claiming jobs (dispatcher/db/store.py): the claim statement and the selections it is built from,
-- and when the next scheduled job falls due.
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. Parameters use psycopg's %(name)s style; {placeholders} in braces are filled in by code
-- with validated integers only.

-- name: jobs_claim
-- Claim up to %(limit)s runnable jobs of one queue in ONE statement: select (by the mode's
-- {select_ids}, one of the claim_select_* fragments below), mark running, set owner, token and
-- lease, count the attempt, return the rows.
-- The WHERE re-checks status (and run_at: a job retried meanwhile is not due yet) on the row it
-- updates. The partitioned selections take no row locks, so if two owners overlap during a
-- hand-off (or a stealer takes rows of our buckets) the second waits for the first and then
-- skips the row: contention, never a double claim. The re-check is written as a CASE on purpose:
-- as plain `status = 'queued' AND run_at <= now()` it matches the partial indexes' predicate and
-- the planner walked (or bitmap-ANDed) a whole claim index of 500k rows instead of fetching the
-- selected ids by primary key. `id = ANY(ids)`, not `UPDATE ... FROM c`: the latter was planned
-- as a full scan of the table, at about half the throughput. tests/integration/test_claim.py
-- guards these plans on a fresh table.
-- `locked_at` comes back as epoch seconds (float8), not a timestamptz: building an aware datetime
-- per row cost the client ~2.7 us per job (one connection claiming 100k jobs in 500s: 19.3 against
-- 16.4 us per job, PostgreSQL 15); Job.locked_at turns it into a datetime when asked.
-- Every row also carries how many ids the selection found (`selected`), and the statement
-- returns one row of NULLs with it when it claimed nothing: a claim that came back short only
-- because others took rows it had selected is not "our buckets ran dry". Without this, an owner
-- whose claim lost a few rows to a stealer at start-up slept a whole poll interval while a
-- stealer drained its buckets (spawn -> done 0.7x of SKIP LOCKED at 2 workers).
-- `scheduled_for` is a recurring job's slot (migration 0012), NULL for every other job; `waited_s`
-- how long the job waited after it was due (dispatcher_job_queue_wait_seconds); `trace_context`
-- the trace of its enqueue (migration 0013), NULL unless OpenTelemetry stored one.
-- %(flow_version)s is the version of the flow-control tables (migrations/0009) the worker's copy
-- was read at: if they changed since, `ids` is NULL, nothing is claimed and `selected` comes back
-- NULL, so the worker reads them again before it claims (NULL: no check, for callers without a
-- copy). The selection runs only when the versions match (CASE evaluates its subquery lazily).
-- The type filter (in braces, filled in by the store) is empty, or keeps out (or in) the job types the flow-control limits bind.
-- {window} and {outranked} are empty but in a claim window's statement (claim_window): then the
-- window's selection and its veto come first, and `outranked` (last) says the veto held.
WITH {window}picked AS MATERIALIZED (
       SELECT CASE WHEN %(flow_version)s::bigint IS NULL
                     OR %(flow_version)s::bigint = coalesce((SELECT version FROM dispatcher_flow_control), 0)
                   THEN ARRAY({select_ids}) END AS ids),
     claimed AS (
       UPDATE dispatcher_jobs
          SET {mark_running}
        WHERE id = ANY((SELECT ids FROM picked)::bigint[])  -- an array, not ANY(subquery)
          AND CASE WHEN status = 'queued' THEN run_at <= now() ELSE false END
       RETURNING id, job_type, payload, attempts, CASE WHEN max_attempts_given THEN max_attempts END AS max_attempts,
                 extract(epoch FROM locked_at)::float8 AS locked_at,
                 bucket, priority, ordering_key, scheduled_for,
                 date_part('epoch', locked_at - run_at) AS waited_s, trace_context)
SELECT c.id, c.job_type, c.payload, c.attempts, c.max_attempts, c.locked_at, c.bucket, c.priority, c.ordering_key,
       cardinality(p.ids) AS selected, c.scheduled_for, c.waited_s, c.trace_context{outranked}
  FROM picked AS p LEFT JOIN claimed AS c ON true

-- name: claim_mark_running
-- A fragment: what every claim writes on the rows it takes (jobs_claim, and jobs_claim_bucket on a
-- distributed table): running under the claim's token and lease, the attempt counted.
status = 'running',
attempts = attempts + 1,
locked_at = now(),
locked_by = %(worker)s,
lock_token = %(token)s::uuid,
lease_expires_at = now() + %(lease_s)s * interval '1 second',
updated_at = now()

-- name: claim_select_partitioned
-- Partitioned mode: {bucket_branches} is one claim_select_partitioned_branch per owned bucket,
-- joined by UNION ALL. Each branch is an ordered walk of that bucket's index range and
-- PostgreSQL merges them (Merge Append) in (priority, run_at, id) order, so a claim of n jobs
-- reads about n + |buckets| index entries and nothing of other workers' buckets.
SELECT id FROM ({bucket_branches}) AS runnable
 ORDER BY priority, run_at, id
 LIMIT %(limit)s

-- name: claim_select_partitioned_branch
-- One owned bucket's runnable jobs in claim order (through dispatcher_jobs_claim_bucket_idx).
(SELECT id, priority, run_at
   FROM dispatcher_jobs
  WHERE queue_name = %(queue)s AND bucket = {bucket} AND status = 'queued' AND run_at <= now() {type_filter}
  ORDER BY priority, run_at, id
  LIMIT %(limit)s)

-- name: claim_window
-- A claim window (dispatcher/runtime/claim_windows.py) and its veto, the CTEs before jobs_claim's
-- `picked`. `win` is the window's selection, as claim_select_partitioned's ({bucket_branches}: its
-- buckets). `outranked` holds if one of the claimer's other buckets, %(outside)s, has a due job
-- of strictly better priority than the worst one `win` selected: then the claim takes nothing
-- and says so, and the worker reads all its buckets instead. Without the veto a single worker
-- started 323 of 400 mixed-priority jobs ahead of a waiting job of better priority. The probe is
-- one scan of dispatcher_jobs_claim_bucket_idx (bucket = ANY: one descent per outside bucket,
-- bounded above by the priority, stopping at the first due job); it reads no due job when the
-- window's worst is as good as everything outside (uniform priorities: one empty range per
-- bucket). Why a veto and not a fallback in the same statement: docs/design/claims.md.
win AS MATERIALIZED (
       SELECT id, priority FROM ({bucket_branches}) AS runnable
        ORDER BY priority, run_at, id
        LIMIT %(limit)s),
     outranked AS MATERIALIZED (
       SELECT EXISTS (
                SELECT 1
                  FROM unnest(%(outside)s::smallint[]) AS o(bucket)
                 CROSS JOIN LATERAL (
                       SELECT 1
                         FROM dispatcher_jobs
                        WHERE queue_name = %(queue)s AND bucket = o.bucket AND status = 'queued'
                          AND priority < (SELECT max(priority) FROM win) AND run_at <= now()
                              {type_filter}
                        LIMIT 1) AS better) AS yes)

-- name: claim_select_window
-- A claim window's selection (claim_window): its jobs, unless the veto holds.
SELECT id FROM win WHERE NOT (SELECT yes FROM outranked)

-- name: claim_window_outranked
-- A claim window's last column (claim_window): whether the veto held (NULL when the flow-control
-- version did not match: then nothing was selected, and nothing probed).
CASE WHEN p.ids IS NOT NULL THEN (SELECT yes FROM outranked) END AS outranked

-- name: claim_select_all_buckets
-- Partitioned mode when this worker owns every bucket (a single worker): one walk of the
-- queue-wide index instead of a 64-branch Merge Append, whose executor start-up alone cost
-- ~2.5 ms per claim (5 us per job). Still no row locks.
SELECT id
  FROM dispatcher_jobs
 WHERE queue_name = %(queue)s AND status = 'queued' AND run_at <= now()
   AND priority > -32769  -- the tag of dispatcher_jobs_claim_idx's predicate (migration 0003)
   {type_filter}
 ORDER BY priority, run_at, id
 LIMIT %(limit)s

-- name: claim_select_steal
-- Stealing (partitioned mode, own buckets idle): take jobs from the TAIL of other workers'
-- buckets, visiting them in the given order (the worker picks and rotates it: stealing.py) and
-- stopping as soon as %(limit)s rows are found. Each bucket keeps its first %(steal_reserve)s due
-- jobs (what its owner takes in one claim; the thief passes 0 once its steals have found nothing
-- for a while: then the owners are not taking them) and gives only what lies beyond them. So a
-- bucket that its owner is draining gives nothing once it is no deeper than a claim: the end of
-- an even drain is left to the owners. The owner claims from the head of its range and the thief
-- from the tail, so they meet only at the end of a bucket: stolen from the head (until
-- 2026-11-25), an owner's claim, which takes no row locks, waited on a thief's and came back
-- short. SKIP LOCKED is for the other thieves of a hot bucket: without it, each one that selected
-- the same tail rows waited for the first and came back empty. Per bucket, `d` reads at most
-- reserve + limit entries from the tail (backwards through the bucket's range of
-- dispatcher_jobs_claim_bucket_idx) and keeps the ids beyond the reserve; `j` locks those it can
-- through the primary key, skipping rows another thief holds (never rows within the reserve).
-- Window functions are not allowed beside FOR UPDATE, hence the two steps.
SELECT j.id
  FROM unnest(%(steal_buckets)s::smallint[]) AS s(bucket)
 CROSS JOIN LATERAL (
       SELECT array_agg(t.id) AS ids
         FROM (SELECT tail.id, count(*) OVER () AS depth,
                      row_number() OVER (ORDER BY tail.priority DESC, tail.run_at DESC, tail.id DESC) AS nth
                 FROM (SELECT id, priority, run_at
                         FROM dispatcher_jobs
                        WHERE queue_name = %(queue)s AND bucket = s.bucket AND status = 'queued'
                          AND run_at <= now() {type_filter}
                        ORDER BY priority DESC, run_at DESC, id DESC
                        LIMIT %(steal_reserve)s + %(limit)s) AS tail) AS t
        WHERE t.nth <= t.depth - %(steal_reserve)s) AS d
 CROSS JOIN LATERAL (
       SELECT id
         FROM dispatcher_jobs
        WHERE id = ANY(d.ids) AND status = 'queued'
          FOR UPDATE SKIP LOCKED) AS j
 LIMIT %(limit)s

-- name: claim_select_skip_locked
-- The classic claim: walk the queue's runnable rows in order, skipping rows other workers hold.
SELECT id
  FROM dispatcher_jobs
 WHERE queue_name = %(queue)s AND status = 'queued' AND run_at <= now()
   AND priority > -32769  -- the tag of dispatcher_jobs_claim_idx's predicate (migration 0003)
   {type_filter}
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED

-- name: jobs_next_due_in
-- Seconds (database clock) until the earliest queued job of one queue that is not due yet, in
-- %(buckets)s (NULL: any bucket); NULL if none. The producer asks after a poll, a due-timer or a bulk
-- wake-up or an assignment change, never per job: it finds jobs scheduled before the worker started,
-- in buckets it just gained, or whose NOTIFY was missed. Bounded: a loose index scan of
-- dispatcher_jobs_claim_idx, two descents per distinct priority, each then reading at most 256 future
-- entries in run_at order until one is in our buckets (uniform buckets: ~64/|buckets| entries). If none
-- of the 256 is ours, the 256th run_at is returned: ours are no earlier, so waking then and asking
-- again is never late.
WITH RECURSIVE priorities AS (
    (SELECT priority FROM dispatcher_jobs
      WHERE queue_name = %(queue)s AND status = 'queued' AND priority > -32769
      ORDER BY priority LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM dispatcher_jobs j
             WHERE j.queue_name = %(queue)s AND j.status = 'queued' AND j.priority > -32769
               AND j.priority > p.priority
             ORDER BY j.priority LIMIT 1)
      FROM priorities p
     WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min(next.run_at) - now())::float8
  FROM priorities p
 CROSS JOIN LATERAL (
    SELECT coalesce(
        (SELECT w.run_at
           FROM (SELECT j.run_at, j.bucket FROM dispatcher_jobs j
                  WHERE j.queue_name = %(queue)s AND j.status = 'queued' AND j.priority > -32769
                    AND j.priority = p.priority AND j.run_at > now()
                  ORDER BY j.run_at LIMIT 256) AS w
          WHERE %(buckets)s::smallint[] IS NULL OR w.bucket = ANY(%(buckets)s::smallint[])
          LIMIT 1),
        (SELECT j.run_at FROM dispatcher_jobs j
          WHERE j.queue_name = %(queue)s AND j.status = 'queued' AND j.priority > -32769
            AND j.priority = p.priority AND j.run_at > now()
          ORDER BY j.run_at OFFSET 255 LIMIT 1)) AS run_at
 ) AS next
 WHERE p.priority IS NOT NULL
