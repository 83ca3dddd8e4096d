"""Process and port plumbing the throwaway servers share: Linux-only calls made lazily, free ports,
server children tied to our life by PR_SET_PDEATHSIG, owner markers and the reaping of leftovers
of dead owners, the children's environment, and the wheels imported on first use.
Why each piece is there: docs/design/embedded-servers.md.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import logging
import os
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
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from dispatcher.errors import DispatcherError

log = logging.getLogger(__name__)

USE_PDEATHSIG = True  # tests set False in a subprocess to simulate a leaked server
INSTALL_HINT = "pip install 'bucket-dispatcher[embedded]'"
_MARKERLESS_GRACE_S = 600.0  # a dir without owner.json younger than this may be mid-creation
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class EmbeddedServerError(DispatcherError, RuntimeError):
    """A throwaway server could not be prepared, started or stopped (the CLI prints it as one
    line)."""


class PortTaken(Exception):
    """The server exited because someone else bound its port first."""


# --------------------------------------------------------------------------- platform (lazy)


def require_linux() -> None:
    if not sys.platform.startswith("linux"):
        raise EmbeddedServerError(
            f"throwaway servers need Linux (prctl PR_SET_PDEATHSIG, /proc), not {sys.platform}; "
            "point DISPATCHER_DSN / DISPATCHER_TEST_DSN at a PostgreSQL of your own instead"
        )


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's prctl. Looked up in the parent, before any fork: dlopen in the child is unsafe."""
    require_linux()
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


def alive(pid: int, start: int | None = None) -> bool:
    """True if pid runs (a zombie counts as dead) and, if given, started at `start`."""
    st = _proc_stat(pid)
    return st is not None and st[0] not in "ZX" and (start is None or st[1] == start)


def bind_port(port: int = 0) -> int | None:
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


def preexec(sig: int) -> Callable[[], None]:
    """A preexec_fn that has the child receive `sig` when the thread that forked it exits."""
    parent = os.getpid()
    prctl = _prctl()  # resolved here, in the parent

    def child() -> None:
        # Runs after CPython's setreuid(), which would clear PDEATHSIG set before it.
        if USE_PDEATHSIG:
            prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
            if os.getppid() != parent:  # parent died before prctl took effect
                os._exit(1)

    return child


_spawner: tuple[int, queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]] | None = None
_spawner_lock = threading.Lock()


def popen_long_lived(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
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


def tail(path: Path, offset: int = 0, lines: int = 30) -> str:
    """The last `lines` lines of a log written after `offset`, for an error message."""
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
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive(pid):
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


# --------------------------------------------------------------------------- owners and leftovers


def write_owner(d: Path) -> None:
    """Mark `d` as ours (pid, start time, pid namespace), so a later start can tell a leftover."""
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
    return pidns == _pidns() and not alive(pid, start)


def reap_orphans(prefix: str, pidfile: str, workdir: str, exe: str, sig: int) -> None:
    """Remove `prefix*` temp dirs whose owner process is dead, killing their server first."""
    for d in Path(tempfile.gettempdir()).resolve().glob(prefix + "*"):
        try:
            if d.is_symlink() or not d.is_dir() or not _owner_gone(d):
                continue
            try:
                pid = int((d / pidfile).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = 0
            if pid > 0 and alive(pid) and _is_server(pid, exe, d / workdir):
                log.warning("killing leaked %s pid %d of dead owner (%s)", exe, pid, d)
                _kill_pid(pid, sig)
            shutil.rmtree(d, ignore_errors=True)
            log.info("removed orphaned %s", d)
        except OSError as e:  # another process may be reaping the same dir
            log.debug("skipping %s: %s", d, e)


# --------------------------------------------------------------------------- binaries


def child_env() -> dict[str, str]:
    """Our environment minus PG* (PGPORT etc. must not leak in) with the C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_"))}
    return env | {"LANG": "C", "LC_ALL": "C"}


_wheel_lock = threading.Lock()


def from_wheel(module: str, attr: str, dist: str, server: str) -> Any:
    """`module.attr` from a wheel of the `embedded` extra, imported on first use only.

    Warnings are silenced for the import: they concern the wheels' own launchers, which we
    don't use. Not installed: one line saying which extra to install.
    """
    with _wheel_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            # one of its dependencies
            if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:
                raise EmbeddedServerError(f"the {dist} wheel failed to import: {e!r}") from e
            raise EmbeddedServerError(
                f"the throwaway {server} needs the {dist!r} package of the 'embedded' extra: "
                f"{INSTALL_HINT}"
            ) from e
        except Exception as e:  # e.g. platformdirs refusing an unsafe runtime dir
            raise EmbeddedServerError(f"the {dist} wheel failed to import: {e!r}") from e
