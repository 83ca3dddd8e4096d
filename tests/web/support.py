"""What the dashboard tests share: a database holding jobs in every status (one of them carrying
script in its payload and error), the dashboard served by a real uvicorn on a free port, and
plain HTTP with cookies and forms."""

from __future__ import annotations

import contextlib
import http.cookiejar
import re
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from dispatcher.api.enqueue import enqueue_sync
from dispatcher.settings.config import Config
from tests.helpers import wait_until

# The queue the seeded jobs live in: no worker serves it, so their statuses stay as set.
SEEDED = "reports"
MARK = "__xss"  # what the hostile payload would set on window if any of it ran
HOSTILE = (
    f'<script>window.{MARK}=1;document.title="pwned"</script>'
    f"<img src=x onerror=\"window.{MARK}=2;document.title='pwned'\">"
)
CSRF_META = re.compile(r'<meta name="csrf-token" content="([0-9a-f]+)">')


@dataclass
class Seeded:
    ids: dict[str, list[int]] = field(default_factory=dict)  # status -> job ids
    hostile: int = 0  # a failed job whose payload and error hold HOSTILE


def seed(dsn: str, per_status: int = 3) -> Seeded:
    """Jobs of SEEDED in every status, put there by SQL as a worker would leave them."""
    seeded = Seeded()
    with psycopg.connect(dsn, autocommit=True) as conn:

        def add(status: str, sql: str = "", params: tuple[Any, ...] = (), **options: Any) -> int:
            job_id = enqueue_sync(
                conn,
                options.pop("job_type", "report.build"),
                options.pop("payload", {"n": 1}),
                queue=SEEDED,
                **options,
            )
            assert job_id is not None
            if sql:
                conn.execute(f"UPDATE dispatcher_jobs SET {sql} WHERE id = %s", (*params, job_id))
            seeded.ids.setdefault(status, []).append(job_id)
            return job_id

        for i in range(per_status):
            add("queued", payload={"n": i})
            add("scheduled", delay_s=3600)
            add(
                "running",
                "status = 'running', attempts = 1, locked_by = 'seed-worker', "
                "lease_expires_at = now() + interval '1 hour'",
            )
            add(
                "failed",
                "status = 'failed', attempts = 3, failed_at = now(), "
                'last_error = \'Traceback (most recent call last):\n  File "app.py", line 9\n'
                "RuntimeError: smtp timeout'",
            )
            add(
                "discarded",
                "status = 'discarded', attempts = 1, last_error = 'ValueError: bad address'",
            )
            add("cancelled", "status = 'cancelled'")
            add("completed", "status = 'completed', attempts = 1")
        holder = add("queued", ordering_key="customer-7")
        seeded.ids["queued"].remove(holder)
        seeded.ids.setdefault("holder", []).append(holder)
        add("waiting", ordering_key="customer-7")
        seeded.hostile = add(
            "failed",
            "status = 'failed', attempts = 2, failed_at = now(), last_error = %s, errors = %s",
            (
                "Traceback (most recent call last):\nValueError: " + HOSTILE,
                Jsonb(
                    [{"attempt": 1, "at": "2026-11-29T00:00:00+00:00", "error": "first " + HOSTILE}]
                ),
            ),
            job_type="evil",
            payload={"html": HOSTILE, "note": "</pre><b>bold?</b>"},
        )
        seeded.ids["failed"].remove(seeded.hostile)
        conn.execute("ANALYZE dispatcher_jobs")
    return seeded


def statuses(dsn: str, ids: list[int]) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(
            conn.execute(
                "SELECT id, status FROM dispatcher_jobs WHERE id = ANY(%s)", (ids,)
            ).fetchall()
        )


class Served:
    """The dashboard of `config` on 127.0.0.1:<free port>, in a thread, until stop()."""

    def __init__(self, config: Config) -> None:
        import uvicorn

        from dispatcher.web.routes import create_app

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(config),
                log_config=None,
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=2,
            )
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        wait_until(lambda: self.server.started, 20, "the dashboard serving")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
        assert not self.thread.is_alive(), "the dashboard did not stop within 15 s"


@contextlib.contextmanager
def served(dsn: str, **web: Any) -> Iterator[Served]:
    """`web` are the web settings (web_allow_actions=True, web_token=...)."""
    server = Served(Config(dsn=dsn, **web))
    try:
        yield server
    finally:
        server.stop()


class Client:
    """A browser-like HTTP client: cookies kept, redirects not followed (so they can be checked)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect
        )

    def request(
        self, path: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        req = urllib.request.Request(
            self.base + path,
            data=body,
            headers=headers or {},
            method="POST" if data is not None else "GET",
        )
        try:
            with self.opener.open(req, timeout=30) as response:
                return (
                    response.status,
                    {k.lower(): v for k, v in response.headers.items()},
                    response.read().decode(),
                )
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()

    def csrf(self, path: str = "/flow") -> str:
        """The form token a page of the dashboard carries (this client's CSRF cookie set with
        it)."""
        status, _, html = self.request(path)
        assert status == 200, (status, html[:300])
        match = CSRF_META.search(html)
        assert match, "the page carries a CSRF token"
        return match[1]
