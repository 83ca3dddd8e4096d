-- The archive of completed jobs (docs/design/archive.md): under DISPATCHER_COMPLETED_JOBS=archive
-- a completion deletes the job's row from dispatcher_jobs and appends it here in the same fenced
-- statement (sql/archive.sql), so the table every claim walks holds live and unsuccessful jobs
-- only, and retention drops whole partitions instead of deleting rows.
--
-- dispatcher_jobs_archive: the jobs table's columns, in its order (a test compares the two: a
-- migration that adds a column to one adds it to the other), partitioned by range of
-- completed_at. Only completed jobs: failed, discarded and cancelled ones stay where retry, cancel
-- and the halted keys act on them. Ids stay unique across both tables: they come from the jobs'
-- identity, and a row is in one table or the other, moved by one statement.
-- Indexes: the primary key (id, bucket, completed_at: a Citus cluster needs the bucket in it) for `jobs show`, results and the newest-first list;
-- a BRIN on completed_at for recent outcomes (an append-only table in time order); the batch and
-- tags filters' own, partial, so a job without them writes no entry.
-- The default partition holds what no range partition covers (the janitor fell behind, or rows
-- completed by an older release before the upgrade): never an error in a completion.
--
-- dispatcher_archive_maintain: the janitor's one call per round (runtime/janitor.py): creates
-- partitions ahead, drops those past retention, deletes default-partition rows past retention,
-- and says how old the oldest of what is left is (the janitor's lag for the archive).
-- SECURITY DEFINER, owned by the migrating role: the workers' role keeps rows-only privileges and
-- EXECUTE (`dispatcher grants`). Its DDL waits at most 100 ms for a lock (then the next round
-- tries again): a DROP queued behind a long reader of the archive would hold up every completion.
--
-- One transaction: a new table and a function, no lock on the jobs beyond reading their shape.
SET LOCAL lock_timeout = '5s';

CREATE TABLE IF NOT EXISTS dispatcher_jobs_archive (LIKE dispatcher_jobs INCLUDING DEFAULTS)
    PARTITION BY RANGE (completed_at);
ALTER TABLE dispatcher_jobs_archive ALTER COLUMN completed_at SET NOT NULL;
ALTER TABLE dispatcher_jobs_archive DROP CONSTRAINT IF EXISTS dispatcher_jobs_archive_status_check;
ALTER TABLE dispatcher_jobs_archive ADD CONSTRAINT dispatcher_jobs_archive_status_check
    CHECK (status = 'completed');
ALTER TABLE dispatcher_jobs_archive DROP CONSTRAINT IF EXISTS dispatcher_jobs_archive_pkey;
ALTER TABLE dispatcher_jobs_archive ADD CONSTRAINT dispatcher_jobs_archive_pkey PRIMARY KEY (id, bucket, completed_at);
CREATE INDEX IF NOT EXISTS dispatcher_jobs_archive_completed_idx
    ON dispatcher_jobs_archive USING brin (completed_at);
CREATE INDEX IF NOT EXISTS dispatcher_jobs_archive_batch_idx
    ON dispatcher_jobs_archive (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS dispatcher_jobs_archive_tags_idx
    ON dispatcher_jobs_archive USING gin (tags) WHERE tags IS NOT NULL;
CREATE TABLE IF NOT EXISTS dispatcher_jobs_archive_default PARTITION OF dispatcher_jobs_archive DEFAULT;
-- Its own btree on completed_at: the upkeep reads its oldest row and deletes past retention in
-- that order each round (it is empty unless the janitor fell behind, so the index costs nothing).
CREATE INDEX IF NOT EXISTS dispatcher_jobs_archive_default_completed_idx
    ON dispatcher_jobs_archive_default (completed_at);

-- Range partitions: named dispatcher_jobs_archive_<start, UTC>. Bounds read back from the catalog.
CREATE OR REPLACE FUNCTION dispatcher_archive_maintain(period_s integer, ahead_s double precision,
                                                       retention_s double precision, default_limit integer)
RETURNS TABLE (created integer, dropped integer, default_deleted bigint, oldest_age_s double precision)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '100ms'
AS $$
DECLARE
    part record;
    start_at timestamptz;
    end_at timestamptz;
    last_to timestamptz;
    oldest_to timestamptz;
    newest timestamptz;
    oldest timestamptz;
    cutoff timestamptz;
    name text;
    made integer := 0;
    gone integer := 0;
    removed bigint := 0;
BEGIN
    IF period_s IS NULL OR period_s NOT IN (60, 300, 900, 3600, 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'period_s',
            MESSAGE = 'period_s must be 60, 300, 900, 3600 or 86400, got ' || coalesce(period_s::text, 'NULL');
    END IF;
    IF ahead_s IS NULL OR ahead_s < 0 OR ahead_s > 7 * 86400 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'ahead_s',
            MESSAGE = 'ahead_s must be between 0 and 604800, got ' || coalesce(ahead_s::text, 'NULL');
    END IF;
    -- One caller at a time (two pods whose janitor leases overlap for a moment): the other skips.
    IF NOT pg_try_advisory_xact_lock(7022450133) THEN
        RETURN QUERY SELECT 0, 0, 0::bigint, NULL::float8;
        RETURN;
    END IF;
    -- Past retention: whole partitions whose upper bound is older than it (0: kept forever).
    IF retention_s > 0 THEN
        FOR part IN
            SELECT b.relname FROM (
                SELECT c.relname,
                       substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']+)'\)$r$)::timestamptz AS to_at
                  FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass AND c.relname <> 'dispatcher_jobs_archive_default') AS b
             WHERE b.to_at <= now() - retention_s * interval '1 second'
             ORDER BY b.to_at
        LOOP
            EXECUTE format('DROP TABLE %I', part.relname);
            gone := gone + 1;
        END LOOP;
        -- Rows no range partition took: deleted like the hot table's, a bounded batch per round
        -- (by id, not ctid: Citus plans no DELETE by ctid over shards).
        cutoff := now() - retention_s * interval '1 second';
        DELETE FROM dispatcher_jobs_archive_default
         WHERE completed_at < cutoff
           AND id = ANY(ARRAY(SELECT d.id FROM dispatcher_jobs_archive_default AS d
                               WHERE d.completed_at < cutoff LIMIT default_limit));
        GET DIAGNOSTICS removed = ROW_COUNT;
    END IF;
    -- The range partitions left after the drops: the newest upper bound (where creation goes on)
    -- and the oldest (what retention waits on next); then the oldest default-partition row.
    SELECT max(b.to_at), min(b.to_at) INTO last_to, oldest_to
      FROM (SELECT substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']+)'\)$r$)::timestamptz AS to_at
              FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'dispatcher_jobs_archive'::regclass
               AND c.relname <> 'dispatcher_jobs_archive_default') AS b;
    SELECT min(d.completed_at) INTO oldest FROM dispatcher_jobs_archive_default AS d;
    -- Ahead: from the last partition's upper bound, or from this period's start where that is
    -- later (none yet, or the janitor fell behind: the rows since went to the default partition),
    -- and past any default-partition row at or after it (attaching a range that holds one fails).
    -- Each partition ends at the next multiple of the period, so a change of period (a new
    -- retention) first fills up to its boundary and never overlaps what exists.
    start_at := to_timestamp(floor(extract(epoch FROM now()) / period_s) * period_s);
    IF last_to IS NOT NULL AND last_to > start_at THEN
        start_at := last_to;
    END IF;
    SELECT max(d.completed_at) INTO newest FROM dispatcher_jobs_archive_default AS d
     WHERE d.completed_at >= start_at;
    IF newest IS NOT NULL THEN
        -- The minute after it: the rest of the span goes to a partition, not to the default.
        start_at := to_timestamp((floor(extract(epoch FROM newest) / 60) + 1) * 60);
    END IF;
    WHILE start_at < now() + ahead_s * interval '1 second' AND made < 64 LOOP
        end_at := to_timestamp((floor(extract(epoch FROM start_at) / period_s) + 1) * period_s);
        name := 'dispatcher_jobs_archive_' || to_char(start_at AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
        -- CREATE, then ATTACH: attaching locks the archive SHARE UPDATE EXCLUSIVE, which lets
        -- completions insert meanwhile (CREATE ... PARTITION OF would take ACCESS EXCLUSIVE).
        EXECUTE format('CREATE TABLE %I (LIKE dispatcher_jobs_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       name);
        EXECUTE format('ALTER TABLE dispatcher_jobs_archive ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       name, start_at, end_at);
        made := made + 1;
        start_at := end_at;
    END LOOP;
    -- The age of the oldest thing retention waits on (the janitor's lag is how far past retention
    -- it is): the oldest range partition's upper bound, or the oldest default-partition row
    -- (partitions created just now are ahead of the clock: never the oldest that matters).
    RETURN QUERY SELECT made, gone, removed, extract(epoch FROM now() - least(oldest_to, oldest))::float8;
END
$$;
REVOKE EXECUTE ON FUNCTION dispatcher_archive_maintain(integer, double precision, double precision, integer)
    FROM PUBLIC;

-- The first partition: this quarter hour's. The janitor of a fleet that archives makes the rest
-- at its first round; a fleet that does not never needs more (on a Citus cluster each partition
-- is 64 shards, which `migrate --citus` and every shard move would carry for nothing).
SELECT * FROM dispatcher_archive_maintain(900, 0, 0, 0);
