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


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "192.168.1.2", "no-such-host.invalid"])
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
    for wrong in ("", "Bearer", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN):
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
    assert not csrf.valid(cookie, None) and not csrf.valid(None, token) and not csrf.valid(cookie, "")
    assert not csrf.valid(cookie, token[:-1] + ("0" if token[-1] != "0" else "1"))


def test_a_post_from_another_origin_is_refused():
    here = {"host": "127.0.0.1:8080"}
    assert security.same_origin({**here, "origin": "http://127.0.0.1:8080"}, "http")
    assert security.same_origin({**here, "referer": "http://127.0.0.1:8080/jobs/1"}, "http")
    assert security.same_origin(here, "http"), "no Origin nor Referer: a script; the CSRF token still decides"
    for headers in ({"origin": "http://evil.example"}, {"origin": "https://127.0.0.1:8080"}, {"origin": "null"},
                    {"referer": "http://evil.example/127.0.0.1:8080/"}):
        assert not security.same_origin({**here, **headers}, "http"), headers
