"""The life of one throwaway server process, shared by PostgreSQL, Redis (and the tests' PgBouncer):
a temp dir of its own, a free 127.0.0.1 port with retries, start, readiness wait, restart on the
same port, and a stop that also runs at exit. Subclasses say how to start and probe their server.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from dispatcher.devtools.embedded.processes import (
    EmbeddedServerError,
    PortTaken,
    bind_port,
    child_env,
    popen_long_lived,
    preexec,
    reap_orphans,
    tail,
    write_owner,
)

log = logging.getLogger(__name__)

_PORT_ATTEMPTS = 5  # a free port can be grabbed by someone else between probe and bind


class ServerProcess:
    """One server process in a temp dir of its own, stopped at exit. A subclass sets the class
    attributes below and implements `_start_on(port)` (spawn, then `_wait_ready`) and `_probe()`."""

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
        reap_orphans(self._prefix, self._pidfile, self._workdir, self._exe, self._death_signal)
        self.tmpdir = Path(tempfile.mkdtemp(prefix=self._prefix)).resolve()
        write_owner(self.tmpdir)
        self.logfile = self.tmpdir / f"{self._exe}.log"
        atexit.register(self._atexit)

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else 0

    def _spawn(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        with self.logfile.open("ab") as out:  # the child keeps its own copy of the fd
            return popen_long_lived(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                cwd=self.tmpdir,
                start_new_session=True,
                preexec_fn=preexec(self._death_signal),
                **kw,
            )

    def _probe(self) -> bool:
        raise NotImplementedError

    def _wait_ready(self, log_offset: int) -> None:
        """Poll until our server answers; PortTaken if it lost the port race."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                last = tail(self.logfile, log_offset)
                if "Address already in use" in last:
                    raise PortTaken(last)
                raise EmbeddedServerError(
                    f"{self._exe} exited with {self._proc.returncode}; log:\n{last}"
                )
            if self._probe():
                return
            if time.monotonic() > deadline:
                self._terminate()
                last = tail(self.logfile, log_offset)
                raise EmbeddedServerError(
                    f"{self._exe} not ready within {self.startup_timeout:.0f}s; log:\n{last}"
                )
            time.sleep(0.05)

    def _start_on(self, port: int) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        try:
            for attempt in range(_PORT_ATTEMPTS):
                try:
                    port = bind_port()
                    if port is None:
                        raise EmbeddedServerError("cannot bind any port on 127.0.0.1")
                    self._start_on(port)
                    return
                except PortTaken:
                    log.info(
                        "%s lost its port to another process, retry %d", self._exe, attempt + 1
                    )
            raise EmbeddedServerError(f"{self._exe}: no free port after {_PORT_ATTEMPTS} attempts")
        except BaseException:
            self.stop()
            raise

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        # Graceful first (10 s), then the death signal (PG: immediate shutdown), then SIGKILL.
        for sig, timeout in (
            (self._stop_signal, 10.0),
            (self._death_signal, 5.0),
            (signal.SIGKILL, None),
        ):
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
        if bind_port(self.port) is None:
            raise EmbeddedServerError(
                f"port {self.port} is taken; cannot restart {self._exe} on it"
            )
        try:
            self._start_on(self.port)
        except PortTaken as e:
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

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
