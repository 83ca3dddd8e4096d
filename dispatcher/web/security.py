"""The dashboard's guards: who may listen where, who may look, which POSTs are genuine.

- `check_bind`: a non-loopback address needs a token (DISPATCHER_WEB_TOKEN) or --insecure.
- `Gate`: with a token, a request carries `Authorization: Bearer <token>` or the cookie of a
  login made with it (compared in constant time; sessions live in this process's memory).
- CSRF: a random cookie per browser, and in every form an HMAC of it under this process's key;
  a POST without it, or with another, is refused (403), as is one from another origin.
- `host_allowed`: without a token, only requests addressed to a loopback name (DNS rebinding).
- `SecurityHeaders`: a Content-Security-Policy that allows this origin's script and style files
  only (no inline script, no CDN), and the usual headers against framing and sniffing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
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
MAX_SESSIONS = 10_000  # logins kept; the oldest is forgotten first
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


class Gate:
    """Who may look: everyone (no token), or whoever shows the token or a session made with it."""

    def __init__(self, token: str | None) -> None:
        self._token = token.strip().encode() if token else None
        self._sessions: dict[str, float] = {}  # session id -> expiry (monotonic)

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
        if self._token is None:
            return True
        scheme, _, credential = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(credential):
            return True
        sid = cookies.get(SESSION_COOKIE)
        expiry = self._sessions.get(sid) if sid else None
        if sid is None or expiry is None:
            return False
        if expiry < time.monotonic():
            self._sessions.pop(sid, None)
            return False
        return True

    def login(self) -> str:
        """A new session id (after the token was checked)."""
        if len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = time.monotonic() + SESSION_TTL_S
        return sid

    def logout(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)


class Csrf:
    """Form tokens bound to the browser's CSRF cookie by an HMAC under a key of this process."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

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
