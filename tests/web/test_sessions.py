"""Logins that survive: two real `dispatcher web` processes with one session secret share them (a
login on one is good on the other, a form of one posts to the other), a restart keeps them, and
a process of another secret refuses them (dispatcher/web/security.py, Sessions)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import ROOT, fetchval, free_port, http_get, stop_workers, wait_until
from tests.web.support import SEEDED, Client, seed

TOKEN = "t0ken-for-the-replica-tests-0123"
SECRET = "one-session-secret-for-every-replica-0123"
OTHER_SECRET = "another-session-secret-for-a-new-rollout-0123"
STOP_S = 15  # SIGTERM, then SIGKILL: the server's own bound is 5 s, the pool's 2 s more


@contextmanager
def dashboard(dsn: str, port: int, secret: str, log: Path) -> Iterator[str]:
    """`dispatcher web` on 127.0.0.1:port with the token and `secret`, until the block ends; its
    URL once /readyz answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env.update(DISPATCHER_WEB_TOKEN=TOKEN, DISPATCHER_WEB_SESSION_SECRET=secret)
    command = [sys.executable, "-m", "dispatcher", "web", "--dsn", dsn, "--port", str(port)]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*command, "--allow-actions"], env=env, cwd=ROOT, stdout=out, stderr=out
        )
    try:
        wait_until(
            lambda: proc.poll() is not None or http_get(port, "/readyz") == (200, b"ready"),
            60,
            lambda: f"the dashboard on port {port}: {log.read_text()[-2000:]}",
        )
        assert proc.poll() is None, log.read_text()[-2000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        assert stop_workers([proc], timeout_s=STOP_S) == [0], log.read_text()[-2000:]


def login(client: Client) -> str:
    """Log `client` in with the token; its session cookie."""
    page = client.request("/login")[2]
    form_token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert form_token, page[:500]
    status, headers, _ = client.request("/login", {"csrf_token": form_token[1], "token": TOKEN})
    assert status == 303 and "dispatcher_session=v1." in headers["set-cookie"], (status, headers)
    [session] = [c.value for c in client.jar if c.name == "dispatcher_session"]
    return session


def paused(dsn: str) -> int:
    return fetchval(
        dsn, "SELECT count(*) FROM dispatcher_paused_queues WHERE queue_name = %s", (SEEDED,)
    )


def test_two_replicas_share_a_login_and_its_forms_and_a_restart_keeps_it(dsn, tmp_path):
    seed(dsn)
    port_a = free_port()
    port_b = wait_until(lambda: (port := free_port()) != port_a and port, 5, "a second port")
    with dashboard(dsn, port_b, SECRET, tmp_path / "b.log") as url_b:
        with dashboard(dsn, port_a, SECRET, tmp_path / "a.log") as url_a:
            # One browser behind a load balancer: each request may land on either replica.
            browser = Client(url_a)
            session = login(browser)
            form_token = browser.csrf("/flow")  # a form rendered by A ...
            browser.base = url_b
            status, _, page = browser.request(f"/jobs?queue={SEEDED}")
            assert status == 200 and "report.build" in page, (status, page[:300])
            # ... posted to B: its CSRF key is B's too
            status, headers, _ = browser.request(
                "/queues/pause", {"csrf_token": form_token, "queue": SEEDED}
            )
            assert (status, headers.get("location")) == (303, "/flow?done=paused")
            assert paused(dsn) == 1
        # A restarted (a new process, the same port): the login holds there too.
        with dashboard(dsn, port_a, SECRET, tmp_path / "a.log") as url_a:
            browser.base = url_a
            status, _, page = browser.request("/flow")
            assert status == 200 and f'<tr data-queue="{SEEDED}">' in page
            status, _, _ = browser.request(
                "/queues/resume", {"csrf_token": form_token, "queue": SEEDED}
            )
            assert status == 303 and paused(dsn) == 0
            # Logging out forgets the cookie in this browser; a copy of it lives until it
            # expires or the secret rotates (stateless: no replica keeps a list to strike it from).
            assert browser.request("/logout", {"csrf_token": form_token})[0] == 303
            assert browser.request("/")[0] == 303
            copy = Client(url_b)
            assert copy.request("/", headers={"Cookie": f"dispatcher_session={session}"})[0] == 200
    # A rollout with a new secret: every login made under the old one is refused.
    with dashboard(dsn, port_a, OTHER_SECRET, tmp_path / "c.log") as url_c:
        stale = Client(url_c)
        status, headers, _ = stale.request("/", headers={"Cookie": f"dispatcher_session={session}"})
        assert (status, headers.get("location")) == (303, "/login")
        status, _, _ = stale.request(
            "/queues/pause",
            {"csrf_token": form_token, "queue": SEEDED},
            {"Cookie": f"dispatcher_session={session}"},
        )
        assert status == 401 and paused(dsn) == 0
        login(stale)
        assert stale.request("/")[0] == 200
