-- Forming a throwaway Citus cluster (dispatcher/devtools/citus_cluster.py): one `-- name:` header
-- per statement. CREATE and DROP DATABASE are composed in code (an identifier, not a parameter).

-- name: cluster_create_extension
CREATE EXTENSION IF NOT EXISTS citus

-- name: cluster_set_coordinator
SELECT citus_set_coordinator_host('127.0.0.1', %(port)s)

-- name: cluster_add_node
SELECT citus_add_node('127.0.0.1', %(port)s)

-- name: cluster_end_sessions
-- Sessions on a template database (Citus's maintenance daemon, the coordinator's cached
-- connections): a template is copied only while no one is connected to it.
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %(dbname)s AND pid <> pg_backend_pid()

-- name: cluster_health
SELECT * FROM citus_check_cluster_node_health()

-- name: cluster_create_database
CREATE DATABASE {name}

-- name: cluster_create_database_from
CREATE DATABASE {name} TEMPLATE {template}

-- name: cluster_drop_database
DROP DATABASE IF EXISTS {name} WITH (FORCE)
