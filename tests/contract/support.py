"""Backend factories for the contract suite (fixtures: conftest.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import redis
from psycopg import sql

from coordinator.backend import CoordinatorBackend
from coordinator.backend_pg import PostgresBackend
from coordinator.backend_redis import RedisBackend

KINDS = ["postgres", "postgres_leases_only", "redis"]


def _free_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BackendFactory:
    """Makes backends of one kind on one test's cluster; every one is closed by
    `connected`/`dead`."""

    kind: str
    # closing a member's backend drops it from the view at once (no lease wait)
    drops_on_close: bool
    driver_error: type[BaseException]  # what the driver raises: never seen outside a backend

    def __call__(self, group: str = "default") -> CoordinatorBackend:
        """A backend of this cluster for coordination group `group` (one per queue)."""
        raise NotImplementedError

    def _dead(self) -> CoordinatorBackend:
        raise NotImplementedError

    def corrupt(self) -> None:
        """Break the stored bucket state so reads fail with a driver error that is not a
        connection failure (a missing table, a key of the wrong type)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The server refuses every connection inside the block and drops the ones it had;
        afterwards it accepts them again (restartable_factory only)."""
        raise NotImplementedError
        yield

    @contextlib.asynccontextmanager
    async def connected(self, n: int) -> AsyncIterator[list[Any]]:
        """n connected backends on this cluster, one per simulated member; closed afterwards."""
        made = [self() for _ in range(n)]
        try:
            for b in made:
                await b.connect()
            yield made
        finally:
            for b in made:
                await b.close()

    @contextlib.asynccontextmanager
    async def dead(self) -> AsyncIterator[Any]:
        """A backend (never connected) whose server does not exist."""
        backend = self._dead()
        try:
            yield backend
        finally:
            await backend.close()

    def __repr__(self) -> str:
        return f"<{self.kind} factory>"


class PostgresFactory(BackendFactory):
    driver_error = psycopg.Error

    def __init__(self, dsn: str, session_locks: bool, admin_dsn: str | None = None) -> None:
        self.kind = "postgres" if session_locks else "postgres_leases_only"
        self.dsn = dsn
        self.session_locks = session_locks
        self.drops_on_close = session_locks
        self._admin_dsn = admin_dsn

    def __call__(self, group: str = "default") -> PostgresBackend:
        return PostgresBackend(self.dsn, group=group, session_locks=self.session_locks)

    def _dead(self) -> PostgresBackend:
        dsn = psycopg.conninfo.make_conninfo(self.dsn, host="127.0.0.1", port=str(_free_port()))
        return PostgresBackend(dsn, session_locks=self.session_locks)

    def corrupt(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE dispatcher_bucket_owners")

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        assert self._admin_dsn is not None, "use restartable_factory"
        dbname = psycopg.conninfo.conninfo_to_dict(self.dsn)["dbname"]
        with psycopg.connect(self._admin_dsn, autocommit=True) as admin:
            ident = sql.Identifier(dbname)
            admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(ident))
            try:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (dbname,),
                )
                yield
            finally:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(ident)
                )


class RedisFactory(BackendFactory):
    kind = "redis"
    drops_on_close = False
    driver_error = redis.RedisError

    def __init__(self, url: str, prefix: str, server: Any = None) -> None:
        self.url = url
        self.prefix = prefix
        self._server = server  # an EmbeddedRedis this test owns (restartable_factory), else None

    def __call__(self, group: str = "default") -> RedisBackend:
        # As dispatcher/serve/coordination.py does it: one key prefix per group.
        return RedisBackend(
            self.url, prefix=self.prefix if group == "default" else f"{self.prefix}:{group}"
        )

    def _dead(self) -> RedisBackend:
        return RedisBackend(f"redis://127.0.0.1:{_free_port()}/0", prefix=self.prefix)

    def corrupt(self) -> None:
        key = self().keys.buckets
        with redis.Redis.from_url(self.url) as r:
            r.delete(key)
            r.set(key, "not a hash")

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        assert self._server is not None, "use restartable_factory"
        self._server.kill()
        try:
            yield
        finally:
            self._server.start_again()  # same port, empty: nothing on disk

    def delete_keys(self) -> None:
        with redis.Redis.from_url(self.url) as r:
            keys = list(r.scan_iter(match=f"{self.prefix}:*"))
            if keys:
                r.delete(*keys)
