"""The dashboard's guards as pure logic: where it may listen, the token gate, CSRF tokens, the
origin check (dispatcher/web/security.py; the same over real HTTP: tests/web/test_http.py)."""

from __future__ import annotations

import pytest

from dispatcher.errors import ConfigError
from dispatcher.web import security

TOKEN = "a-token-of-enough-length-1234"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_addresses_need_nothing(host):
    assert security.is_loopback(host)
    security.check_bind(host, None, False)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "10.0.0.7", "192.168.1.2", "no-such-host.invalid"]
)
def test_any_other_address_needs_a_token_or_insecure(host):
    assert not security.is_loopback(host)
    with pytest.raises(ConfigError, match="not a loopback address"):
        security.check_bind(host, None, False)
    security.check_bind(host, TOKEN, False)
    security.check_bind(host, None, True)


def test_the_gate_takes_the_bearer_token_or_a_session_and_nothing_else():
    gate = security.Gate(TOKEN)
    assert not gate.open
    assert gate.allows({"authorization": f"Bearer {TOKEN}"}, {})
    assert gate.allows({"authorization": f"bearer {TOKEN}"}, {})
    for wrong in (
        "",
        "Bearer",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Basic {TOKEN}",
        TOKEN,
    ):
        assert not gate.allows({"authorization": wrong}, {}), wrong
    assert not gate.allows({}, {security.SESSION_COOKIE: "made-up"})
    sid = gate.login()
    assert gate.allows({}, {security.SESSION_COOKIE: sid})
    gate.logout(sid)
    assert not gate.allows({}, {security.SESSION_COOKIE: sid})
    assert security.Gate(None).open and security.Gate(None).allows({}, {})
    assert not security.Gate(None).token_matches(TOKEN), "no token: no login can succeed either"


def test_a_csrf_token_is_valid_only_for_its_own_cookie_and_its_own_process():
    csrf, other = security.Csrf(), security.Csrf()
    cookie = csrf.new_cookie()
    token = csrf.token_for(cookie)
    assert csrf.valid(cookie, token)
    assert not csrf.valid(csrf.new_cookie(), token), "another browser's cookie"
    assert not other.valid(cookie, token), "another process's key"
    assert (
        not csrf.valid(cookie, None) and not csrf.valid(None, token) and not csrf.valid(cookie, "")
    )
    assert not csrf.valid(cookie, token[:-1] + ("0" if token[-1] != "0" else "1"))


def test_a_post_from_another_origin_is_refused():
    here = {"host": "127.0.0.1:8080"}
    assert security.same_origin({**here, "origin": "http://127.0.0.1:8080"})
    assert security.same_origin({**here, "referer": "http://127.0.0.1:8080/jobs/1"})
    assert security.same_origin(here), (
        "no Origin nor Referer: a script; the CSRF token still decides"
    )
    for headers in (
        {"origin": "http://evil.example"},
        {"origin": "http://127.0.0.1:8081"},
        {"origin": "null"},
        {"origin": "http://127.0.0.1:8080.evil.example"},
        {"origin": "ftp://127.0.0.1:8080"},
        {"referer": "http://evil.example/127.0.0.1:8080/"},
        {"referer": "http://[::1"},
        {"referer": "http://127.0.0.1:8080@evil.example/"},
    ):
        assert not security.same_origin({**here, **headers}), headers


def test_behind_a_proxy_that_ends_tls_the_browsers_https_origin_is_this_server():
    """The browser says https://dash.example.com; the dashboard, behind the proxy, sees http."""
    assert security.same_origin({"host": "dash.example.com", "origin": "https://dash.example.com"})
    assert security.same_origin(
        {"host": "dash.example.com", "referer": "https://dash.example.com/jobs"}
    )
    assert not security.same_origin(
        {"host": "dash.example.com", "origin": "https://evil.example.com"}
    )


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8080",
        "127.0.0.1",
        "localhost:8080",
        "LOCALHOST",
        "[::1]:8080",
        "127.0.0.53:80",
        "app.localhost:8080",
    ],
)
def test_without_a_token_a_loopback_host_header_is_answered(host):
    assert security.host_allowed(host, "127.0.0.1")


@pytest.mark.parametrize(
    "host",
    [
        None,
        "",
        "evil.example:8080",
        "evil.example",
        "127.0.0.1.evil.example",
        "localhost.evil.example:8080",
        "10.0.0.7:8080",
        "[::1",
        "a b",
    ],
)
def test_without_a_token_any_other_host_header_is_refused_dns_rebinding(host):
    assert not security.host_allowed(host, "127.0.0.1")


def test_the_address_it_listens_on_is_its_own_name_too():
    assert security.host_allowed("[::1]:8080", "::1") and security.host_allowed(
        "myhost:8080", "myhost"
    )
    assert not security.host_allowed("otherhost:8080", "myhost")
