-- Schema versions and the migration runner's own statements (dispatcher/db/migrate.py; the
-- worker's start-up check reads the versions too: dispatcher/serve/startup.py). The migrations
-- themselves are in migrations/.
--
-- One `-- name:` header per statement; dispatcher/db/queries.py finds a name in any file of this
-- folder. {placeholders} in braces are filled in by code: an integer, or a quoted identifier.

-- name: schema_version_table_exists
SELECT to_regclass('dispatcher_schema_version') IS NOT NULL

-- name: schema_versions_applied
SELECT version FROM dispatcher_schema_version ORDER BY version

-- name: schema_version_latest
SELECT max(version) FROM dispatcher_schema_version

-- name: schema_version_create
-- Not in a migration: it records them. privileges.py grants SELECT on it to workers.
CREATE TABLE IF NOT EXISTS dispatcher_schema_version (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: schema_version_record
INSERT INTO dispatcher_schema_version (version, name) VALUES (%(version)s, %(name)s)

-- name: migrate_begin
BEGIN

-- name: migrate_rollback
ROLLBACK

-- name: migrate_try_lock
-- {key} inlined, not a parameter: a statement with parameters leaves its portal, and with it a
-- snapshot (backend_xmin), open until the transaction ends, and CREATE INDEX CONCURRENTLY in the
-- work connection would wait for that snapshot forever ("waiting for old snapshots").
SELECT pg_try_advisory_xact_lock({key})

-- name: index_is_valid
SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(index)s)

-- name: index_drop_concurrently
DROP INDEX CONCURRENTLY IF EXISTS {index}
