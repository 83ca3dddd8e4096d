-- One coordination group per queue, as Kafka assigns each topic's partitions among that topic's
-- subscribers: a queue's 64 buckets are shared among the live members that serve that queue, so
-- a bucket is never owned by a worker that does not poll its queue. A worker serving N queues is
-- a member of N groups. `queue` names the group; existing rows become the group of 'default'
-- (the state is transient: members re-register within a heartbeat, the leader re-places buckets).

ALTER TABLE dispatcher_members ADD COLUMN queue text NOT NULL DEFAULT 'default';
ALTER TABLE dispatcher_members DROP CONSTRAINT dispatcher_members_pkey;
ALTER TABLE dispatcher_members ADD PRIMARY KEY (queue, member_id);

-- One leader per group (was: one row, id = 1).
ALTER TABLE dispatcher_leader ADD COLUMN queue text NOT NULL DEFAULT 'default';
ALTER TABLE dispatcher_leader DROP CONSTRAINT dispatcher_leader_pkey;
ALTER TABLE dispatcher_leader DROP CONSTRAINT dispatcher_leader_id_check;
ALTER TABLE dispatcher_leader DROP COLUMN id;
ALTER TABLE dispatcher_leader ADD PRIMARY KEY (queue);

-- A group's 64 rows are created by its first member (buckets_init), so queues need no DDL.
ALTER TABLE dispatcher_bucket_owners ADD COLUMN queue text NOT NULL DEFAULT 'default';
ALTER TABLE dispatcher_bucket_owners DROP CONSTRAINT dispatcher_bucket_owners_pkey;
ALTER TABLE dispatcher_bucket_owners ADD PRIMARY KEY (queue, bucket);
