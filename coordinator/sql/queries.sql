-- Statements of the PostgreSQL coordination backend (coordinator/backend_pg.py), by name.
-- Every statement is confined to one group, %(queue)s (the queue whose buckets it assigns; see
-- migration 0005). %(lock_class)s is the first key of every member's session advisory lock; the
-- second is the member's lock_key: hashtext of "queue/member", made non-negative so it compares
-- with pg_locks.objid. A worker in N groups holds N such locks, one per coordination connection.

-- name: member_lock
-- Held for the life of the member's coordination connection; released by PostgreSQL the moment
-- that connection dies (a SIGKILLed worker), which is how a death shows within a second.
SELECT pg_try_advisory_lock(%(lock_class)s, hashtext(%(queue)s || '/' || %(member)s) & 2147483647)

-- name: buckets_init
-- A group's 64 bucket rows, created by whichever member comes first (idempotent, DML only).
INSERT INTO dispatcher_bucket_owners (queue, bucket)
SELECT %(queue)s, b FROM generate_series(0, %(num_buckets)s - 1) AS b
ON CONFLICT (queue, bucket) DO NOTHING

-- name: member_heartbeat
-- Register or refresh a member; returns true when it (re)joined, i.e. was not live before.
WITH prev AS (
    SELECT expires_at > now() AND NOT leaving AS live FROM dispatcher_members
     WHERE queue = %(queue)s AND member_id = %(member)s
), up AS (
    INSERT INTO dispatcher_members (queue, member_id, lock_key, expires_at)
    VALUES (%(queue)s, %(member)s, hashtext(%(queue)s || '/' || %(member)s) & 2147483647,
            now() + %(lease_s)s * interval '1 second')
    ON CONFLICT (queue, member_id) DO UPDATE
        SET heartbeat_at = now(), expires_at = EXCLUDED.expires_at, leaving = false
    RETURNING member_id
)
SELECT NOT coalesce((SELECT live FROM prev), false) FROM up

-- name: leader_acquire_or_renew
-- Win a free or expired leadership (or one whose holder's session lock is gone), or renew our
-- own. Returns a row only if we lead after this statement.
INSERT INTO dispatcher_leader AS l (queue, leader_id, lock_key, expires_at)
VALUES (%(queue)s, %(member)s, hashtext(%(queue)s || '/' || %(member)s) & 2147483647,
        now() + %(lease_s)s * interval '1 second')
ON CONFLICT (queue) DO UPDATE
    SET leader_id = EXCLUDED.leader_id,
        lock_key = EXCLUDED.lock_key,
        expires_at = EXCLUDED.expires_at,
        term = l.term + CASE WHEN l.leader_id = EXCLUDED.leader_id THEN 0 ELSE 1 END,
        elected_at = CASE WHEN l.leader_id = EXCLUDED.leader_id THEN l.elected_at ELSE now() END
    WHERE l.leader_id = EXCLUDED.leader_id
       OR l.expires_at < now()
       OR (%(session_locks)s AND NOT EXISTS (
               SELECT 1 FROM pg_locks k
                WHERE k.locktype = 'advisory' AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND k.classid = %(lock_class)s::oid
                  AND k.objid = l.lock_key::oid AND k.objsubid = 2 AND k.granted))
RETURNING leader_id

-- name: cluster_view
-- Everything a member needs in one round trip: 64 bucket rows, each carrying the live members,
-- the leader and the seconds until the next lease expiry (repeated; 64 short rows). Members sort
-- by code point (COLLATE "C"), as Python and the Redis backend sort them, whatever the database's
-- collation.
WITH live AS (
    SELECT m.member_id, m.expires_at
      FROM dispatcher_members m
     WHERE m.queue = %(queue)s AND m.expires_at > now() AND NOT m.leaving
       AND (NOT %(session_locks)s OR EXISTS (
               SELECT 1 FROM pg_locks k
                WHERE k.locktype = 'advisory' AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND k.classid = %(lock_class)s::oid
                  AND k.objid = m.lock_key::oid AND k.objsubid = 2 AND k.granted))
), leader AS (
    SELECT leader_id, expires_at FROM dispatcher_leader WHERE queue = %(queue)s AND expires_at > now()
), meta AS (
    SELECT coalesce((SELECT array_agg(member_id ORDER BY member_id COLLATE "C") FROM live), '{}') AS members,
           (SELECT leader_id FROM leader) AS leader,
           extract(epoch FROM least((SELECT min(expires_at) FROM live), (SELECT expires_at FROM leader)) - now())::float8
               AS next_expiry_s
)
SELECT b.bucket, b.owner, b.next_owner, b.epoch,
       b.next_owner IS NOT NULL AND b.revoke_deadline < now() AS revoke_overdue,
       meta.members, meta.leader, meta.next_expiry_s
  FROM dispatcher_bucket_owners b CROSS JOIN meta
 WHERE b.queue = %(queue)s
 ORDER BY b.bucket

-- name: rebalance_lock
-- One rebalance per group at a time, even if two members briefly both believe they lead.
-- Transaction-scoped: safe behind PgBouncer in transaction pooling mode. Its own lock class, so
-- it can never wait on a member's session lock.
SELECT pg_advisory_xact_lock(%(lock_class)s + 1, hashtext(%(queue)s))

-- name: leader_check
SELECT 1 FROM dispatcher_leader WHERE queue = %(queue)s AND leader_id = %(member)s AND expires_at > now()

-- name: buckets_apply
-- The leader's changes, each only if the bucket is still at the epoch the plan was made from.
UPDATE dispatcher_bucket_owners AS b
   SET owner = CASE c.kind WHEN 'assign' THEN c.owner ELSE b.owner END,
       next_owner = CASE c.kind WHEN 'revoke' THEN c.owner ELSE NULL END,
       revoke_deadline = CASE c.kind WHEN 'revoke' THEN now() + %(deadline_s)s * interval '1 second' END,
       epoch = b.epoch + CASE c.kind WHEN 'assign' THEN 1 ELSE 0 END,
       updated_at = now()
  FROM unnest(%(buckets)s::smallint[], %(epochs)s::bigint[], %(kinds)s::text[], %(owners)s::text[])
       AS c(bucket, epoch, kind, owner)
 WHERE b.queue = %(queue)s AND b.bucket = c.bucket AND b.epoch = c.epoch

-- name: buckets_hand_over
-- The old owner completes hand-offs it was asked for (after its in-flight claim finished).
UPDATE dispatcher_bucket_owners
   SET owner = next_owner, next_owner = NULL, revoke_deadline = NULL, epoch = epoch + 1, updated_at = now()
 WHERE queue = %(queue)s AND bucket = ANY(%(buckets)s::smallint[]) AND owner = %(member)s
   AND next_owner IS NOT NULL AND next_owner <> %(member)s

-- name: member_leave_buckets
-- Graceful exit: buckets with a pending hand-off go to their next owner at once, the rest become
-- unowned for the leader to place; hand-offs *to* the leaver are cancelled (nullif: a revoke of
-- the leaver's bucket to the leaver itself leaves it unowned, not owned by the leaver).
UPDATE dispatcher_bucket_owners
   SET owner = CASE WHEN owner = %(member)s THEN nullif(next_owner, %(member)s) ELSE owner END,
       epoch = epoch + CASE WHEN owner = %(member)s THEN 1 ELSE 0 END,
       next_owner = NULL, revoke_deadline = NULL, updated_at = now()
 WHERE queue = %(queue)s AND (owner = %(member)s OR next_owner = %(member)s)

-- name: member_leave
UPDATE dispatcher_members SET leaving = true, expires_at = now() WHERE queue = %(queue)s AND member_id = %(member)s

-- name: leader_resign
DELETE FROM dispatcher_leader WHERE queue = %(queue)s AND leader_id = %(member)s

-- name: members_prune
-- Forget members gone for an hour (their rows only serve people reading the table).
DELETE FROM dispatcher_members WHERE expires_at < now() - interval '1 hour'

-- name: notify_change
SELECT pg_notify(%(channel)s, %(payload)s)

-- Shared PostgreSQL plumbing (coordinator/pg/), used by both packages.

-- name: local_timeouts
-- The bounds of a one-shot command's transaction (coordinator/pg/connect.py, local_timeouts):
-- local to it, so nothing leaks to other clients of a PgBouncer pool.
SELECT set_config('statement_timeout', %(statement)s, true), set_config('lock_timeout', %(lock)s, true)

-- name: listen
-- {channel}: a quoted identifier (psycopg.sql.Identifier), filled in by code.
LISTEN {channel}

-- name: listen_probe
-- A LISTEN connection silent for a while asks this, so that a stall on it shows. Named, so that
-- it is told apart from the lease keeper's `ping` in pg_stat_statements.
SELECT 1 AS listen_probe
