"""The dashboard's guards as pure logic: where it may listen, the token gate, CSRF tokens, the
origin check (dispatcher/web/security.py; the same over real HTTP: tests/web/test_http.py)."""

from __future__ import annotations

import pytest

from dispatcher.errors import ConfigError
from dispatcher.web import security

TOKEN = "a-token-of-enough-length-1234"
SECRET = "a-session-secret-of-enough-length-0123456789"


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
    gate = security.Gate(TOKEN, SECRET)
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
    cookie = gate.login()
    assert gate.allows({}, {security.SESSION_COOKIE: cookie})
    # another replica, or this one restarted: the same token and secret accept it
    assert security.Gate(TOKEN, SECRET).allows({}, {security.SESSION_COOKIE: cookie})
    assert security.Gate(None, None).open and security.Gate(None, None).allows({}, {})
    assert not security.Gate(None, None).token_matches(TOKEN), "no token: no login either"
    with pytest.raises(ConfigError, match="DISPATCHER_WEB_SESSION_SECRET"):
        security.Gate(TOKEN, None)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_is_valid_until_it_expires_then_refused():
    clock = Clock()
    sessions = security.Sessions(SECRET, TOKEN, clock=clock)
    cookie = sessions.issue()
    version, issued, expires, nonce, mac = cookie.split(".")
    assert (version, int(issued), int(expires)) == ("v1", 1_800_000_000, 1_800_043_200)
    assert len(nonce) >= 16 and len(mac) == 43
    assert sessions.valid(cookie)
    assert sessions.issue() != cookie, "each login its own nonce"
    clock.now += security.SESSION_TTL_S - 1
    assert sessions.valid(cookie)
    clock.now += 1
    assert not sessions.valid(cookie), "expired"


def test_a_tampered_session_is_refused():
    sessions = security.Sessions(SECRET, TOKEN)
    cookie = sessions.issue()
    version, issued, expires, nonce, mac = cookie.split(".")
    flipped = mac[:-1] + ("A" if mac[-1] != "A" else "B")
    for forged in (
        f"{version}.{issued}.{int(expires) + 3600}.{nonce}.{mac}",  # a longer life
        f"{version}.{int(issued) + 1}.{expires}.{nonce}.{mac}",
        f"{version}.{issued}.{expires}.{nonce[::-1]}.{mac}",
        f"{version}.{issued}.{expires}.{nonce}.{flipped}",
        f"v2.{issued}.{expires}.{nonce}.{mac}",
    ):
        assert not sessions.valid(forged), forged


def test_a_session_of_another_secret_or_token_is_refused():
    cookie = security.Sessions(SECRET, TOKEN).issue()
    assert security.Sessions(SECRET, TOKEN).valid(cookie)
    assert not security.Sessions(SECRET + "x", TOKEN).valid(cookie), "the secret rotated"
    assert not security.Sessions(SECRET, TOKEN + "x").valid(cookie), "the token rotated"


def test_a_malformed_or_future_dated_or_too_long_lived_session_is_refused():
    clock = Clock()
    sessions = security.Sessions(SECRET, TOKEN, clock=clock)
    for bad in (
        None,
        "",
        "v1",
        "v1....",
        "v1.1.2.nonce-of-enough-length.mac",
        sessions.issue() + ".",
        " " + sessions.issue(),
        sessions.issue().replace(".", ";"),
        "v1.-1.43199." + "n" * 24 + "." + "m" * 43,
        "x" * 10_000,
    ):
        assert not sessions.valid(bad), bad
    # issued beyond the replicas' clock skew in the future: refused; within it: taken
    clock.now += security.SESSION_CLOCK_SKEW_S + 1
    ahead = sessions.issue()
    clock.now -= security.SESSION_CLOCK_SKEW_S + 1
    assert not sessions.valid(ahead)
    clock.now += 1
    assert sessions.valid(ahead)
    # signed with our key, but living longer than SESSION_TTL_S, or not at all: not one we issue
    now = int(clock.now)

    def signed(expires: int) -> str:
        body = f"v1.{now}.{expires}.{'n' * 24}"
        return f"{body}.{sessions._mac(body)}"

    assert sessions.valid(signed(now + 60))
    assert not sessions.valid(signed(now + security.SESSION_TTL_S + 1))
    assert not sessions.valid(signed(now))


def test_a_csrf_token_is_valid_only_for_its_own_cookie_and_its_own_key():
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
    # with a session secret, every replica has the same key: a form of one posts to another
    shared = security.Csrf(SECRET)
    assert security.Csrf(SECRET).valid(cookie, shared.token_for(cookie))
    assert not security.Csrf(SECRET + "x").valid(cookie, shared.token_for(cookie))
    assert not csrf.valid(cookie, shared.token_for(cookie))


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
