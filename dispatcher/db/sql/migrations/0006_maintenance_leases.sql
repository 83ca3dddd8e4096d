-- One-pod-at-a-time maintenance roles (the table sampler: dispatcher/runtime/table_sampler.py), each a
-- row with a lease on the database's clock. A pod takes or renews a role in ONE statement that
-- succeeds only if the row is its own or its lease ran out (queries.sql, maintenance_lease_take),
-- so pods need no clock agreement and no session state: it works through PgBouncer in
-- transaction pooling, where session advisory locks do not. A few rows, rewritten every few
-- seconds: HOT updates, no index but the primary key.
CREATE TABLE dispatcher_maintenance_leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
