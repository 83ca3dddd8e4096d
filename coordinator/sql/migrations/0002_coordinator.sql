-- Coordination tables for DISPATCHER_COORDINATOR=postgres (harmless when another is used).

-- Live workers. A member is live while expires_at (database clock) is in the future and, when
-- session locks are on, while it holds its session advisory lock (lock_key): a killed process
-- drops the lock with its connection at once, long before its lease runs out.
CREATE TABLE dispatcher_members (
    member_id    text        PRIMARY KEY,
    lock_key     integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    leaving      boolean     NOT NULL DEFAULT false
);

-- One row: who computes assignments. Won only when free or expired (or when its holder's
-- session lock is gone); renewed only WHERE leader_id = me; resigned with a DELETE + NOTIFY.
CREATE TABLE dispatcher_leader (
    id         smallint    PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    leader_id  text        NOT NULL,
    lock_key   integer     NOT NULL,
    term       bigint      NOT NULL DEFAULT 1,
    elected_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- Who polls each bucket. epoch rises every time a bucket changes hands, so (bucket, epoch)
-- names one owner. next_owner is a pending cooperative hand-off: the owner stops polling, then
-- hands over itself; revoke_deadline is when the leader may force it.
CREATE TABLE dispatcher_bucket_owners (
    bucket          smallint    PRIMARY KEY CHECK (bucket BETWEEN 0 AND 63),
    owner           text,
    next_owner      text,
    epoch           bigint      NOT NULL DEFAULT 0,
    revoke_deadline timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO dispatcher_bucket_owners (bucket) SELECT generate_series(0, 63);
