"""A throwaway Citus cluster for the tests and the bench: a coordinator node and worker nodes, each
its own PostgreSQL (the system's, with the citus extension installed) on a free 127.0.0.1 port,
formed as Citus's documentation says. Databases are made on every node at once, so a test gets a
distributed database of its own (cloned from a template, like the single-node suite's).

`citus_missing()` says why no cluster can start here (None when one can); the tests skip on it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import sql

from coordinator.pg.sqlfile import load
from dispatcher.devtools.embedded import EmbeddedPostgres

# Citus 13.2 is the last line for PostgreSQL 15, the server this project's CI installs it for.
PG_MAJOR: Final = 15
# A CREATE DATABASE copies a template in well under a second; a minute means a node is stuck.
STATEMENT_TIMEOUT_MS: Final = 60_000
_NODE_SETTINGS: Final[dict[str, object]] = {
    "shared_preload_libraries": "citus",
    # Shard moves and online distribution copy rows by logical replication.
    "wal_level": "logical",
    "output_plugin_libraries": "pgoutput,test_decoding,citus",
    "max_replication_slots": 20,
    "max_wal_senders": 20,
    # Each node serves the coordinator's connections to its shards as well as clients.
    "max_connections": 300,
    "citus.max_client_connections": 280,
    # Nodes talk over loopback; the default (sslmode=require) looks in $HOME for certificates.
    "citus.node_conninfo": "sslmode=disable",
}


def _query(name: str) -> str:
    return load("dispatcher.devtools", "cluster.sql")[name]


def _connect(dsn: str) -> psycopg.Connection[Any]:
    """A harness session: it gives up on a node that does not answer instead of hanging."""
    return psycopg.connect(
        dsn,
        autocommit=True,
        connect_timeout=10,
        options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
    )


def server_bindir() -> Path:
    """The installed PostgreSQL's binaries, those of every node (and of the bench's single-node
    baseline beside a cluster: bench/citus.py)."""
    return Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin")


def citus_missing() -> str | None:
    """Why a Citus cluster cannot start on this machine, or None if it can."""
    bindir = server_bindir()
    if not (bindir / "postgres").is_file():
        return f"PostgreSQL {PG_MAJOR} is not installed ({bindir}/postgres is missing)"
    pg_config = bindir / "pg_config"
    if not pg_config.is_file():
        return f"{pg_config} is missing (postgresql-server-dev-{PG_MAJOR})"
    libdir = subprocess.run(
        [str(pg_config), "--pkglibdir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not (Path(libdir) / "citus.so").is_file():
        return f"the citus extension is not installed for PostgreSQL {PG_MAJOR} (no citus.so)"
    return None


class CitusCluster:
    """A coordinator node and `workers` worker nodes. Clients connect to the coordinator only.
    `preload`: more libraries for shared_preload_libraries on every node (the bench's
    pg_stat_statements), loaded after citus, which must come first."""

    def __init__(
        self, workers: int = 2, *, durable: bool = False, preload: Sequence[str] = ()
    ) -> None:
        missing = citus_missing()
        if missing is not None:
            raise RuntimeError(f"cannot start a Citus cluster: {missing}")
        settings = dict(_NODE_SETTINGS)
        if preload:
            settings["shared_preload_libraries"] = ",".join(["citus", *preload])
        self.nodes: list[EmbeddedPostgres] = []
        try:
            for _ in range(workers + 1):
                self.nodes.append(
                    EmbeddedPostgres(
                        durable=durable, settings=settings, system_bindir=server_bindir()
                    )
                )
        except BaseException:
            self.stop()
            raise

    @property
    def coordinator(self) -> EmbeddedPostgres:
        return self.nodes[0]

    @property
    def workers(self) -> list[EmbeddedPostgres]:
        return self.nodes[1:]

    @property
    def admin_dsn(self) -> str:
        return self.coordinator.dsn

    def dsn_for(self, dbname: str) -> str:
        return self.coordinator.dsn_for(dbname)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """`name` on every node (a copy of `template`'s on each, which must be a database this
        cluster made), with Citus's extension and the worker nodes added; its DSN on the
        coordinator."""
        create = sql.SQL(
            _query(
                "cluster_create_database" if template is None else "cluster_create_database_from"
            )
        ).format(name=sql.Identifier(name), template=sql.Identifier(template or name))
        for node in self.nodes:
            with _connect(node.dsn) as conn:
                self._create_on(conn, create, template)
        if template is None:
            for node in self.nodes:
                with _connect(node.dsn_for(name)) as conn:
                    conn.execute(_query("cluster_create_extension"))
            with _connect(self.dsn_for(name)) as conn:
                conn.execute(_query("cluster_set_coordinator"), {"port": self.coordinator.port})
                for node in self.workers:
                    conn.execute(_query("cluster_add_node"), {"port": node.port})
        return self.dsn_for(name)

    @staticmethod
    def _create_on(
        conn: psycopg.Connection[Any], create: sql.Composed, template: str | None
    ) -> None:
        """CREATE DATABASE on one node. A template is copied only while no one is connected
        to it, and Citus keeps sessions open there (its maintenance daemon, the coordinator's
        cached connections to the worker nodes): end them, and try again while they come back."""
        deadline = time.monotonic() + 30.0
        while True:
            if template is not None:
                conn.execute(_query("cluster_end_sessions"), {"dbname": template})
            try:
                conn.execute(create)
                return
            except psycopg.errors.ObjectInUse:
                if template is None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def drop_database(self, name: str) -> None:
        drop = sql.SQL(_query("cluster_drop_database")).format(name=sql.Identifier(name))
        for node in self.nodes:
            # A node a test stopped has nothing to drop until it starts again: its data dir goes.
            with (
                suppress(psycopg.OperationalError),
                _connect(node.dsn) as conn,
            ):
                conn.execute(drop)

    @contextmanager
    def database(self, name: str, *, template: str | None = None) -> Iterator[str]:
        try:
            yield self.create_database(name, template=template)
        finally:
            self.drop_database(name)

    def wait_ready(self, dsn: str, timeout_s: float = 30.0) -> None:
        """Until the coordinator reaches every worker node through `dsn`'s database."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with _connect(dsn) as conn:
                    conn.execute(_query("cluster_health"))
                    return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> CitusCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """`python -m dispatcher.devtools.citus_cluster`: start a cluster, print its DSN, hold it."""
    cluster = CitusCluster()
    dsn = cluster.create_database("dispatcher")
    print(dsn, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
