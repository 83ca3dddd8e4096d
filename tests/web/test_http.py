"""The dashboard over plain HTTP against a real PostgreSQL: every page answers, every value from
the database is escaped, the headers forbid inline script, a POST needs the CSRF token of its
browser, read-only refuses changes, the token gate holds, the workers' DML-only role suffices,
and a database that does not answer gives a 503 within its bound, not a hang."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time

import orjson
import psycopg
import pytest

import dispatcher.web.app as web_app
from tests.helpers import fetchval
from tests.integration.test_privileges import dml_role, grant
from tests.web.support import HOSTILE, SEEDED, Client, seed, served, statuses

PAGES = (
    "/",
    "/jobs",
    f"/jobs?queue={SEEDED}&status=failed",
    "/workers",
    f"/buckets?queue={SEEDED}",
    "/flow",
)
TOKEN = "t0ken-for-the-dashboard-tests-0123"
SECRET = "the-session-secret-of-the-dashboard-tests-0123"


@pytest.fixture
def seeded(dsn):
    return dsn, seed(dsn)


def test_every_page_answers_with_its_data_and_headers_that_forbid_inline_script(seeded):
    dsn, s = seeded
    with served(dsn) as web:
        client = Client(web.url)
        for path in (
            *PAGES,
            f"/jobs/{s.ids['failed'][0]}",
            "/static/dashboard.js",
            "/static/dashboard.css",
        ):
            status, headers, body = client.request(path)
            assert status == 200, (path, body[:500])
            csp = headers["content-security-policy"]
            assert (
                "script-src 'self'" in csp
                and "unsafe-inline" not in csp
                and "default-src 'none'" in csp
            )
            assert (
                headers["x-content-type-options"] == "nosniff"
                and headers["x-frame-options"] == "DENY"
            )
            if path.startswith("/static"):
                continue
            # No inline script or style, no handler attributes, nothing from another origin.
            assert all(
                re.search(r'src="/static/[a-z]+\.js"', tag)
                for tag in re.findall(r"<script[^>]*>", body)
            ), path
            assert not re.search(r"\son[a-z]+\s*=", body) and " style=" not in body, path
            assert not re.search(r'(src|href)="(https?:)?//', body), path
        overview = client.request("/")[2]
        row = re.search(rf'<tr data-queue="{SEEDED}">(.*?)</tr>', overview, re.S)
        assert row, "the seeded queue is on the overview"
        cells = re.findall(r'<td class="num">(.*?)</td>', row[1], re.S)
        numbers = [re.sub(r"<[^>]+>", "", c).strip() for c in cells]
        # due, scheduled, running, waiting, failed, discarded, cancelled, halted
        assert numbers[:8] == [str(len(s.ids["queued"]) + 1), "3", "3", "1", "4", "3", "3", "0"], (
            numbers
        )
        job_page = client.request(f"/jobs/{s.ids['failed'][0]}")[2]
        assert (
            "RuntimeError: smtp timeout" in job_page
            and "Traceback (most recent call last):" in job_page
        )


def test_payloads_and_errors_are_escaped_everywhere(seeded):
    dsn, s = seeded
    with served(dsn) as web:
        client = Client(web.url)
        for path in (
            f"/jobs/{s.hostile}",
            f"/jobs?queue={SEEDED}",
            f"/jobs?queue={SEEDED}&type=evil",
        ):
            body = client.request(path)[2]
            assert (
                "<script>window" not in body and "<img src=x" not in body and "<b>bold?" not in body
            ), path
        body = client.request(f"/jobs/{s.hostile}")[2]
        shown = html.unescape(body)
        assert HOSTILE in shown, "the error is shown, as text"
        assert 'id="errors"' in body and "first " + HOSTILE in shown, "each attempt's, as text"
        assert orjson.dumps(HOSTILE).decode() in shown, "so is the payload (as JSON)"


def test_a_post_without_its_csrf_token_or_with_another_is_refused_and_changes_nothing(seeded):
    dsn, s = seeded
    target = s.ids["failed"][0]
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        token = client.csrf()
        other = Client(web.url)
        other_token = other.csrf()
        attempts = [
            ({}, {}),
            ({"csrf_token": "0" * 64}, {}),
            ({"csrf_token": other_token}, {}),
            ({"csrf_token": token}, {"Origin": "http://evil.example"}),
        ]
        for form, headers in attempts:
            status, _, body = client.request(f"/jobs/{target}/retry", form, headers)
            assert status == 403 and "CSRF" in body, (form, headers, status)
        status, _, body = client.request("/queues/pause", {"queue": SEEDED})
        assert status == 403
        assert statuses(dsn, [target]) == {target: "failed"}
        assert fetchval(dsn, "SELECT count(*) FROM dispatcher_paused_queues") == 0
        # The same browser with its own token: accepted, also where a proxy in front ends TLS (the
        # browser's Origin then says https, while the dashboard sees http).
        status, headers, _ = client.request(
            f"/jobs/{target}/retry",
            {"csrf_token": token},
            {"Origin": web.url.replace("http://", "https://")},
        )
        assert status == 303 and headers["location"] == f"/jobs/{target}?done=retried"
        assert statuses(dsn, [target]) == {target: "queued"}


def test_read_only_shows_no_action_and_refuses_every_change(seeded):
    dsn, s = seeded
    target = s.ids["failed"][0]
    with served(dsn) as web:
        client = Client(web.url)
        token = client.csrf()
        page = client.request(f"/jobs/{target}")[2]
        assert (
            "action-retry" not in page
            and "/actions/confirm" not in client.request("/jobs?status=failed")[2]
        )
        for path, form in (
            (f"/jobs/{target}/retry", {}),
            ("/actions/retry", {"status": "failed", "up_to_id": "999"}),
            ("/queues/pause", {"queue": SEEDED}),
        ):
            status, _, body = client.request(path, {"csrf_token": token, **form})
            assert status == 403 and "read-only" in body, path
        assert client.request("/actions/confirm?action=retry&status=failed")[0] == 403
    assert statuses(dsn, [target]) == {target: "failed"}
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_paused_queues") == 0


def test_a_bulk_change_says_how_many_match_first_then_changes_exactly_those(seeded):
    dsn, s = seeded
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        status, _, page = client.request(
            f"/actions/confirm?action=retry&queue={SEEDED}&status=failed"
        )
        assert status == 200
        matching = int(re.search(r'id="matching"><strong>(\d+)</strong>', page)[1])
        assert matching == len(s.ids["failed"]) + 1  # the hostile one too
        assert f"{matching}</strong> jobs match and can be retried" in page
        for action, done in (("cancel", "cancelled"), ("purge", "purged")):
            other = client.request(f"/actions/confirm?action={action}&queue={SEEDED}")[2]
            assert re.search(rf"</strong> jobs match and can be {done}\s+\(", other), other[-600:]
        form = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', page))
        assert set(form) == {"csrf_token", "queue", "status", "up_to_id", "as_of"}, form
        late = seed(dsn, per_status=1).ids["failed"]  # failed after the count: not swept in
        # A job that was running when the page counted, and failed since: not what was counted.
        changed = s.ids["running"][0]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE dispatcher_jobs "
                "SET status = 'failed', failed_at = now(), updated_at = now() WHERE id = %s",
                (changed,),
            )
        for lost in ("up_to_id", "as_of"):  # a form that lost what was counted changes nothing
            status, _, body = client.request(
                "/actions/retry", {k: v for k, v in form.items() if k != lost}
            )
            assert status == 400 and "start again" in body, lost
        assert statuses(dsn, [s.hostile]) == {s.hostile: "failed"}
        status, _, result = client.request("/actions/retry", form)
        assert (
            status == 200 and f"{matching} changed" in result and "stopped part-way" not in result
        ), result[-800:]
    assert set(statuses(dsn, [*s.ids["failed"], s.hostile]).values()) == {"queued"}
    assert set(statuses(dsn, late).values()) == {"failed"}
    assert statuses(dsn, [changed]) == {changed: "failed"}


def test_a_long_bulk_change_stops_at_its_time_share_and_says_how_far_it_got(seeded, monkeypatch):
    import dispatcher.web.actions as actions

    dsn, s = seeded
    monkeypatch.setattr(actions, "BULK_TIME_S", 0.0)  # the share is spent before the first batch
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        page = client.request(f"/actions/confirm?action=retry&queue={SEEDED}&status=failed")[2]
        form = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', page))
        status, _, result = client.request("/actions/retry", form)
        assert status == 200 and "stopped part-way" in result and "; 0 changed" in result, result[
            -800:
        ]
        again = html.unescape(re.search(r'<a href="([^"]+)">Count them and go on</a>', result)[1])
        assert again.startswith("/actions/confirm?") and "action=retry" in again
        monkeypatch.setattr(actions, "BULK_TIME_S", 60.0)
        dashboard = web.server.config.app.state.dashboard
        dashboard.stopping = True  # as at SIGTERM: the change stops at its next batch
        page = client.request(again)[2]
        form = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', page))
        status, _, result = client.request("/actions/retry", form)
        assert status == 200 and "stopped part-way" in result and "; 0 changed" in result, result[
            -800:
        ]
        dashboard.stopping = False
        status, _, result = client.request("/actions/retry", form)
        assert status == 200 and "Retry: done" in result
    assert set(statuses(dsn, [*s.ids["failed"], s.hostile]).values()) == {"queued"}


def test_without_a_token_only_a_request_addressed_to_loopback_is_answered(seeded):
    """DNS rebinding: another site's name, re-pointed at 127.0.0.1, reaches the port from the
    user's browser, but sends its own name as Host."""
    dsn, s = seeded
    target = s.ids["failed"][0]
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        for host in (f"localhost:{web.port}", f"127.0.0.1:{web.port}"):
            assert client.request("/jobs", headers={"Host": host})[0] == 200, host
        token = client.csrf()
        for host in (
            f"evil.example:{web.port}",
            "evil.example",
            f"127.0.0.1.evil.example:{web.port}",
        ):
            status, _, body = client.request(f"/jobs/{s.hostile}", headers={"Host": host})
            assert status == 400 and "DISPATCHER_WEB_TOKEN" in body and "smtp" not in body, (
                host,
                body[:300],
            )
            status, _, _ = client.request(
                f"/jobs/{target}/retry",
                {"csrf_token": token},
                {"Host": host, "Origin": f"http://{host}"},
            )
            assert status == 400, host
        assert statuses(dsn, [target]) == {target: "failed"}
    # with a token, the token decides whatever the name
    with served(dsn, web_token=TOKEN, web_session_secret=SECRET) as web:
        headers = {"Host": "dash.example.com", "Authorization": "Bearer " + TOKEN}
        assert Client(web.url).request("/jobs", headers=headers)[0] == 200


def test_bad_filters_get_a_clear_error_page(seeded):
    dsn, _ = seeded
    with served(dsn) as web:
        client = Client(web.url)
        for path, words in (
            ("/jobs?older_than=soon", "older_than"),
            ("/jobs?status=lost", "unknown status"),
            ("/jobs?queue=a%20b", "not a name"),
            ("/jobs?before=x", "before"),
            ("/buckets?queue=%3Cscript%3E", "not a queue name"),
            ("/jobs/0", "No such job"),
        ):
            status, _, body = client.request(path)
            assert status in (400, 404) and words in html.unescape(body), (path, status)
            assert "<script>" not in body


def test_with_a_token_every_page_needs_it_or_a_login(seeded):
    dsn, _ = seeded
    with served(dsn, web_token=TOKEN, web_session_secret=SECRET) as web:
        client = Client(web.url)
        status, headers, _ = client.request("/")
        assert status == 303 and headers["location"] == "/login"
        assert client.request("/", headers={"X-Dispatcher-Fragment": "1"})[0] == 401
        assert (
            client.request("/jobs", headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})[0]
            == 303
        )
        assert client.request("/jobs", headers={"Authorization": "Bearer " + TOKEN})[0] == 200
        assert client.request("/healthz")[0] == 200 and client.request("/readyz")[0] == 200
        login_page = client.request("/login")[2]
        token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', login_page)[1]
        assert (
            client.request("/login", {"csrf_token": token, "token": "wrong-token-wrong-token"})[0]
            == 401
        )
        # login needs its CSRF token too
        assert client.request("/login", {"token": TOKEN})[0] == 403
        status, headers, _ = client.request("/login", {"csrf_token": token, "token": TOKEN})
        assert status == 303 and "dispatcher_session=" in headers["set-cookie"]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=strict" in headers["set-cookie"]
        assert client.request("/")[0] == 200
        token = client.csrf("/")
        assert client.request("/logout", {"csrf_token": token})[0] == 303
        assert client.request("/")[0] == 303


def test_the_workers_dml_only_role_can_read_every_page_and_act(seeded):
    dsn, s = seeded
    roles = dml_role(dsn)
    role, role_dsn = next(roles)
    try:
        grant(dsn, role)
        with served(role_dsn, web_allow_actions=True) as web:
            client = Client(web.url)
            for path in (*PAGES, f"/jobs/{s.hostile}"):
                assert client.request(path)[0] == 200, path
            token = client.csrf()
            target = s.ids["queued"][0]
            assert client.request(f"/jobs/{target}/cancel", {"csrf_token": token})[0] == 303
            assert client.request("/queues/pause", {"csrf_token": token, "queue": SEEDED})[0] == 303
        assert statuses(dsn, [target]) == {target: "cancelled"}
        assert (
            fetchval(
                dsn,
                "SELECT count(*) FROM dispatcher_paused_queues WHERE queue_name = %s",
                (SEEDED,),
            )
            == 1
        )
    finally:
        next(roles, None)


def test_a_database_that_does_not_answer_gives_503_in_bounded_time(monkeypatch):
    monkeypatch.setattr(web_app, "POOL_WAIT_S", 2.0)
    import socket

    with socket.socket() as hole:  # a port that accepts nothing: bound, never listening
        hole.bind(("127.0.0.1", 0))
        dsn = f"postgresql://nobody@127.0.0.1:{hole.getsockname()[1]}/none"
        with served(dsn, connect_timeout_s=2) as web:
            client = Client(web.url)
            began = time.monotonic()
            assert client.request("/readyz")[0] == 503
            status, _, body = client.request("/jobs")
            assert status == 503 and "database did not answer" in body
            assert client.request("/healthz")[0] == 200
            assert time.monotonic() - began < 20


def test_the_command_refuses_a_public_address_without_a_token(dsn):
    env_free = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", "web", "--dsn", dsn, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_free,
    )
    assert (
        done.returncode == 2
        and "not a loopback address" in done.stderr
        and "DISPATCHER_WEB_TOKEN" in done.stderr
    )


def test_each_action_does_what_the_admin_does_and_says_so(seeded):
    dsn, s = seeded
    running, completed = s.ids["running"][0], s.ids["completed"][0]
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        token = client.csrf()
        # A running job is asked to stop; its worker ends it (the row stays running until then).
        status, headers, _ = client.request(f"/jobs/{running}/cancel", {"csrf_token": token})
        assert (status, headers["location"]) == (303, f"/jobs/{running}?done=cancel-requested")
        assert fetchval(
            dsn,
            "SELECT cancel_requested_at IS NOT NULL FROM dispatcher_jobs WHERE id = %s",
            (running,),
        )
        assert "Cancel requested" in client.request(headers["location"])[2]
        # Purge deletes a finished job's row; the page of a job with no row and no history is a 404.
        status, headers, _ = client.request(f"/jobs/{completed}/purge", {"csrf_token": token})
        assert (status, headers["location"]) == (303, f"/jobs/{completed}?done=purged")
        assert statuses(dsn, [completed]) == {}
        assert client.request(f"/jobs/{completed}")[0] == 404
        # Retrying a job whose status does not allow it changes nothing and says so.
        queued = s.ids["queued"][0]
        status, headers, _ = client.request(f"/jobs/{queued}/retry", {"csrf_token": token})
        assert headers["location"] == f"/jobs/{queued}?done=skipped" and statuses(
            dsn, [queued]
        ) == {queued: "queued"}
        assert client.request(f"/jobs/{queued}/explode", {"csrf_token": token})[0] == 400
        # Pause, then resume, the queue: the flow page lists it in between.
        assert client.request("/queues/pause", {"csrf_token": token, "queue": SEEDED})[0] == 303
        assert f'<tr data-queue="{SEEDED}">' in client.request("/flow")[2].split("<h2>Limits")[0]
        assert (
            fetchval(
                dsn,
                "SELECT count(*) FROM dispatcher_paused_queues WHERE queue_name = %s",
                (SEEDED,),
            )
            == 1
        )
        assert client.request("/queues/resume", {"csrf_token": token, "queue": SEEDED})[0] == 303
        assert fetchval(dsn, "SELECT count(*) FROM dispatcher_paused_queues") == 0
        assert (
            client.request("/queues/pause", {"csrf_token": token, "queue": "no spaces"})[0] == 400
        )
        assert client.request("/jobs/1/retry", {"csrf_token": token, "x": "y" * 70_000})[0] == 413


def test_the_command_serves_until_sigterm_then_exits_0_within_its_bound(dsn):
    import os
    import signal

    from tests.helpers import free_port, http_get, wait_until

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher", "web", "--dsn", dsn, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: http_get(port, "/readyz") == (200, b"ready"), 60, "the dashboard ready")
        assert http_get(port, "/")[0] == 200
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - began < 10, (
            "the server's shutdown bound (5 s) and the pool's (2 s)"
        )
        assert (
            f"dashboard on http://127.0.0.1:{port} (read-only, loopback only)" in proc.stdout.read()
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
