"""A throwaway PgBouncer (Debian's `pgbouncer` binary) in front of the test PostgreSQL.

Transaction pooling, as in the deployments docs/operations/pgbouncer.md is about: every
transaction (every statement in autocommit) may run on a different server connection, so
session state (session advisory locks, LISTEN, prepared statements on PgBouncer < 1.21) does
not follow the client. The tests that use it prove the worker needs none of that with the
settings docs/operations/pgbouncer.md gives.

The lifecycle is embedded.py's `_Server` (private there, reused here on purpose): a temp dir of
its own, a free port with retries, PR_SET_PDEATHSIG so a killed pytest takes PgBouncer down
too, and leftovers of a crashed run reaped at the next start. PgBouncer refuses to run as root,
so as root it runs as the same unprivileged system user as the throwaway PostgreSQL.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psycopg

from dispatcher.devtools.embedded import _pg_user, _Server

BINARY_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
INSTALL_HINT = "pgbouncer not installed: apt-get install pgbouncer"


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None (callers skip with INSTALL_HINT)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((p for p in BINARY_CANDIDATES if os.access(p, os.X_OK)), None)


def pgbouncer_version(binary: str) -> tuple[int, ...]:
    """(1, 18, 0) from `pgbouncer --version` ("PgBouncer 1.18.0 ...")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise RuntimeError(f"cannot read the version of {binary}: {out!r}")
    return tuple(int(g or 0) for g in match.groups())


class PgBouncer(_Server):
    """PgBouncer on 127.0.0.1:<free port>, pool_mode=transaction, auth_type=trust, forwarding
    every database name to the PostgreSQL of `server_dsn` (which must trust its clients).

    `users`: the login names clients may use (trust still needs them listed in auth_file).
    `settings`: extra or overriding [pgbouncer] settings, e.g. {"default_pool_size": 2}.
    """

    _prefix = "dispatcher-pgbouncer-"
    _exe = "pgbouncer"
    _stop_signal = signal.SIGTERM  # immediate shutdown (SIGINT would wait for clients to leave)
    _death_signal = signal.SIGKILL
    _pidfile = "pgbouncer.pid"

    def __init__(
        self,
        server_dsn: str,
        *,
        binary: str,
        users: Iterable[str] = ("postgres",),
        settings: Mapping[str, object] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.binary = binary
        self.version = pgbouncer_version(binary)
        server = psycopg.conninfo.conninfo_to_dict(server_dsn)
        self._server_host = str(server.get("host") or "127.0.0.1")
        self._server_port = int(server.get("port") or 5432)
        self._probe_dsn = server_dsn
        self.users = tuple(users)
        self.settings: dict[str, object] = {
            "pool_mode": "transaction",
            "auth_type": "trust",
            # A worker holds about 5 connections and a test runs a few: 20 server connections
            # keep clients interleaving on shared ones (the point of the fixture) without queueing.
            "default_pool_size": 20,
            "max_client_conn": 500,
            "admin_users": ",".join(self.users),  # the console (dbname pgbouncer): SHOW CLIENTS
            **(settings or {}),
        }
        super().__init__(startup_timeout)
        self._creds: dict[str, Any] = {}
        try:
            if os.geteuid() == 0:  # "PgBouncer should not run as root"
                uid, gid = _pg_user()
                self._creds = {"user": uid, "group": gid, "extra_groups": []}
                os.chown(self.tmpdir, uid, gid)
        except BaseException:
            self.stop()
            raise
        self._start()

    def dsn_for(self, dsn: str) -> str:
        """`dsn` (a database on the server behind us) routed through PgBouncer."""
        return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    @property
    def dsn(self) -> str:
        return self.dsn_for(self._probe_dsn)

    def clients(self) -> list[str]:
        """application_name of every client connected through us (the console asking excluded)."""
        console = psycopg.conninfo.make_conninfo(self.dsn, dbname="pgbouncer")
        with psycopg.connect(console, autocommit=True) as conn:
            cur = conn.execute("SHOW CLIENTS")
            columns = [d.name for d in cur.description or ()]
            rows = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
        return [r["application_name"] for r in rows if r["database"] != "pgbouncer"]

    def _write_config(self, port: int) -> Path:
        auth_file = self.tmpdir / "userlist.txt"
        auth_file.write_text("".join(f'"{u}" ""\n' for u in self.users))
        lines = [
            "[databases]",
            f"* = host={self._server_host} port={self._server_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",  # TCP only: nothing of ours in /var/run/postgresql
            f"auth_file = {auth_file}",
            f"pidfile = {self.tmpdir / self._pidfile}",
            *(f"{k} = {v}" for k, v in self.settings.items()),
        ]
        ini = self.tmpdir / "pgbouncer.ini"
        ini.write_text("\n".join(lines) + "\n")
        return ini

    def _start_on(self, port: int) -> None:
        self.port = port
        ini = self._write_config(port)
        offset = self.logfile.stat().st_size if self.logfile.exists() else 0
        self._proc = self._spawn([self.binary, str(ini)], **self._creds)
        self._wait_ready(offset)

    def _probe(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True
