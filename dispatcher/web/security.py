"""The dashboard's guards: who may listen where, who may look, which POSTs are genuine.

- `check_bind`: a non-loopback address needs a token (DISPATCHER_WEB_TOKEN) or --insecure.
- `Gate`: with a token, a request carries `Authorization: Bearer <token>` or the cookie of a
  login made with it: `Sessions`, signed and expiring, under a key derived from the session
  secret and the token, so every replica accepts it, a restart keeps it, and rotating either
  logs everyone out (compared in constant time; no session is kept anywhere).
- CSRF: a random cookie per browser, and in every form an HMAC of it under a key derived from
  the session secret (a random one per process without a secret); a POST without it, or with
  another, is refused (403), as is one from another origin.
- `host_allowed`: without a token, only requests addressed to a loopback name (DNS rebinding).
- `SecurityHeaders`: a Content-Security-Policy that allows this origin's script and style files
  only (no inline script, no CDN), and the usual headers against framing and sniffing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from dispatcher.errors import ConfigError

CSRF_COOKIE = "dispatcher_csrf"
SESSION_COOKIE = "dispatcher_session"
CSRF_FIELD = "csrf_token"
SESSION_TTL_S = 12 * 3600
# A login issued this far in the future of this replica's clock is still taken: replicas' wall
# clocks disagree by this much at most (NTP keeps them far closer).
SESSION_CLOCK_SKEW_S = 60
SESSION_VERSION = "v1"
_SESSION = re.compile(
    r"v1\.([0-9]{1,12})\.([0-9]{1,12})\.([A-Za-z0-9_-]{16,64})\.([A-Za-z0-9_-]{43})"
)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src "
    "'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (a name is resolved; one that does
    not resolve is not loopback)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_bind(host: str, token: str | None, insecure: bool) -> None:
    """ConfigError unless `host` is loopback, a token is set, or --insecure was given on purpose."""
    if token is None and not insecure and not is_loopback(host):
        raise ConfigError(
            "--host",
            f"{host!r} is not a loopback address: anyone who reaches it could read every "
            "job's payload; set DISPATCHER_WEB_TOKEN, or pass --insecure if a proxy in "
            "front of it checks who comes in",
        )


class Sessions:
    """Session cookies that need no store: `v1.<issued>.<expires>.<nonce>.<mac>`, the times in
    unix seconds (wall clock: the replicas share no clock but their hosts'), the MAC an
    HMAC-SHA256 of the rest under a key derived from the session secret and the token."""

    def __init__(self, secret: str, token: str, *, clock: Callable[[], float] = time.time) -> None:
        self._key = hmac.new(
            secret.encode(), b"dispatcher session\0" + token.strip().encode(), hashlib.sha256
        ).digest()
        self._clock = clock

    def _mac(self, signed: str) -> str:
        digest = hmac.new(self._key, signed.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self) -> str:
        """A new session cookie, valid for SESSION_TTL_S from now."""
        issued = int(self._clock())
        signed = f"{SESSION_VERSION}.{issued}.{issued + SESSION_TTL_S}.{secrets.token_urlsafe(18)}"
        return f"{signed}.{self._mac(signed)}"

    def valid(self, cookie: str | None) -> bool:
        """Whether `cookie` is one of ours (its MAC, in constant time), issued at most
        SESSION_TTL_S before it expires, not yet expired, and not issued in the future."""
        match = _SESSION.fullmatch(cookie) if cookie else None
        if match is None:
            return False
        signed, _, mac = match[0].rpartition(".")
        if not hmac.compare_digest(self._mac(signed).encode(), mac.encode()):
            return False
        issued, expires, now = int(match[1]), int(match[2]), self._clock()
        return (
            0 < expires - issued <= SESSION_TTL_S
            and now < expires
            and issued <= now + SESSION_CLOCK_SKEW_S
        )


class Gate:
    """Who may look: everyone (no token), or whoever shows the token or a session made with it.
    A token needs a session secret (the config loader requires one)."""

    def __init__(
        self, token: str | None, secret: str | None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._token = token.strip().encode() if token else None
        self._sessions: Sessions | None = None
        if token:
            if not secret:
                raise ConfigError(
                    "DISPATCHER_WEB_SESSION_SECRET", "is required with DISPATCHER_WEB_TOKEN"
                )
            self._sessions = Sessions(secret, token, clock=clock)

    @property
    def open(self) -> bool:
        return self._token is None

    def token_matches(self, given: str | None) -> bool:
        return (
            self._token is not None
            and given is not None
            and hmac.compare_digest(given.strip().encode(), self._token)
        )

    def allows(self, headers: Any, cookies: MutableMapping[str, str]) -> bool:
        if self._sessions is None:
            return True
        scheme, _, credential = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(credential):
            return True
        return self._sessions.valid(cookies.get(SESSION_COOKIE))

    def login(self) -> str:
        """A new session cookie (after the token was checked)."""
        assert self._sessions is not None, "no token: nobody logs in"
        return self._sessions.issue()


class Csrf:
    """Form tokens bound to the browser's CSRF cookie by an HMAC under a key derived from the
    session secret, the same on every replica; without one, a random key of this process."""

    def __init__(self, secret: str | None = None) -> None:
        self._key = (
            hmac.new(secret.encode(), b"dispatcher csrf", hashlib.sha256).digest()
            if secret
            else secrets.token_bytes(32)
        )

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self._key, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, given: str | None) -> bool:
        if not cookie or not given:
            return False
        return hmac.compare_digest(self.token_for(cookie).encode(), given.encode())


def same_origin(headers: Any) -> bool:
    """A POST's Origin (or Referer), where the browser sent one, names this server's host and port.
    The scheme is not compared: behind a proxy that ends TLS the browser says https while this
    server sees http."""
    host = (headers.get("host") or "").lower()
    origin = headers.get("origin") or ""
    if origin and origin != "null":
        return _netloc(origin) == host
    referer = headers.get("referer") or ""
    if referer:
        return _netloc(referer) == host
    # neither header: a non-browser client, which the CSRF token still checks
    return origin != "null"


def _netloc(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts.netloc.lower() if parts.scheme in ("http", "https") and parts.netloc else None


def host_allowed(host_header: str | None, bind_host: str) -> bool:
    """Whether a request's Host names this dashboard as a loopback one: localhost, a loopback
    address, or the address it listens on. Without a token this refuses DNS rebinding: a page of
    another site whose name was re-pointed at 127.0.0.1 reaches the port, but sends its own name."""
    try:
        name = urlsplit("//" + host_header).hostname if host_header else None
    except ValueError:
        return False
    if not name:
        return False
    if name in ("localhost", bind_host.strip("[]").lower()) or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


Asgi = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class SecurityHeaders:
    """ASGI middleware: HEADERS on every response, static files included."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
