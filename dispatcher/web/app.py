"""The plumbing every page of the dashboard shares: the pool, the templates, the login gate and
CSRF, errors as pages (its routes: web/routes.py).

Pages are rendered on the server with Jinja2, autoescaped; each has a `live` block that
static/dashboard.js fetches again every few seconds (header X-Dispatcher-Fragment) and swaps in,
so a page refreshes without a reload and without any inline script. Database work runs in
threads on a small psycopg pool; every statement is bounded (db/oneshot.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
import orjson
import psycopg
import psycopg_pool
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from dispatcher.admin import AdminInputError
from dispatcher.api.text import age_text, bucket_ranges
from dispatcher.errors import StoreError
from dispatcher.observe import logs
from dispatcher.settings.config import Config
from dispatcher.web import security

log = logging.getLogger("dispatcher.web")

HERE = Path(__file__).parent
REFRESH_S = 5  # how often a page fetches its live part again
POOL_MAX = 4  # connections: the database work of concurrent requests beyond this waits for one
POOL_WAIT_S = 10.0  # then the page says the database is busy or unreachable
CACHE_S = 2.0  # a view's data is shared by the requests within this: N open tabs cost one read
MAX_FORM_BYTES = 64 * 1024
FRAGMENT_HEADER = "x-dispatcher-fragment"

Handler = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """What the routes share: settings, the pool, the templates, the gate, the CSRF key."""

    def __init__(
        self, config: Config, *, pool: psycopg_pool.ConnectionPool[Any], insecure: bool = False
    ) -> None:
        self.config = config
        self.limits = config.database.limits
        self.allow_actions = config.web.allow_actions
        self.pool = pool
        self.gate = security.Gate(config.web.token, config.web.session_secret)
        self.csrf = security.Csrf(config.web.session_secret)
        # Open to all only on loopback: then a request must also be addressed to a loopback name.
        self.check_host = self.gate.open and not insecure
        self.stopping = False  # set at shutdown: a bulk change stops at its next batch
        self._cache: dict[Any, tuple[float, Any]] = {}
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(
            age=_age, at=_at, ranges=bucket_ranges, pretty=_pretty, number=_number
        )

    async def db(self, fn: Callable[..., Any], *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        """fn(conn, *args, **kwargs) on a pooled connection, in a thread; with `cache` (a key),
        a result younger than CACHE_S is returned instead."""
        if cache is not None:
            hit = self._cache.get(cache)
            if hit is not None and time.monotonic() - hit[0] < CACHE_S:
                return hit[1]

        def work() -> Any:
            with self.pool.connection(timeout=POOL_WAIT_S) as conn:
                return fn(conn, *args, **kwargs)

        result = await run_in_threadpool(work)
        if cache is not None:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[cache] = (time.monotonic(), result)
        return result

    def forget(self) -> None:
        """Drop the shared view data: after a change, the next page shows it."""
        self._cache.clear()

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """The page, or only its live block when dashboard.js asks for it."""
        tmpl = self.templates.get_template(template)
        context.update(
            request=request,
            allow_actions=self.allow_actions,
            csrf_token=request.state.csrf_token,
            refresh_s=REFRESH_S,
            logged_in=not self.gate.open,
            csrf_field=security.CSRF_FIELD,
        )
        if request.headers.get(FRAGMENT_HEADER) and "live" in tmpl.blocks:
            body = "".join(tmpl.blocks["live"](tmpl.new_context(context)))
        else:
            body = tmpl.render(context)
        return HTMLResponse(body, status_code=status, headers={"cache-control": "no-store"})

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(
            request, "error.html", status=status, status_code=status, message=message
        )


def guarded(handler: Handler, *, post: bool = False, public: bool = False) -> Handler:
    """The route with its guards: CSRF cookie, the login gate, CSRF on POST, errors as pages."""

    async def route(request: Request) -> Response:
        dash: Dashboard = request.app.state.dashboard
        cookie = request.cookies.get(security.CSRF_COOKIE)
        fresh = None if cookie else security.Csrf.new_cookie()
        # one of the two is set: the browser's cookie, else the one this response sets
        request.state.csrf_token = dash.csrf.token_for(cookie or fresh)  # type: ignore[arg-type]
        response: Response
        try:
            if dash.check_host and not security.host_allowed(
                request.headers.get("host"), dash.config.web.host
            ):
                response = PlainTextResponse(
                    "This dashboard answers only to localhost or a loopback address (it has no "
                    "token, and another name could be a DNS-rebinding page). Set "
                    "DISPATCHER_WEB_TOKEN to reach it by another name.",
                    status_code=400,
                )
            elif not public and not dash.gate.allows(request.headers, request.cookies):
                if request.method == "GET" and not request.headers.get(FRAGMENT_HEADER):
                    response = RedirectResponse("/login", status_code=303)
                else:
                    response = PlainTextResponse(
                        "log in first: DISPATCHER_WEB_TOKEN is set", status_code=401
                    )
            elif post and not (
                security.same_origin(request.headers)
                and dash.csrf.valid(cookie, (await form(request)).get(security.CSRF_FIELD))
            ):
                response = dash.error(
                    request,
                    403,
                    "This form is not from this dashboard (its CSRF token is missing "
                    "or wrong). Reload the page and try again.",
                )
            else:
                response = await handler(request)
        except AdminInputError as exc:
            response = dash.error(request, 400, f"{exc} ({exc.option})")
        except FormTooLarge:
            response = dash.error(request, 413, "The form is too large.")
        except (StoreError, psycopg_pool.PoolTimeout, psycopg.OperationalError) as exc:
            log.warning("dashboard: %s: %s", request.url.path, exc)
            response = dash.error(
                request, 503, f"The database did not answer: {logs.redact(str(exc))}"
            )
        if fresh is not None:
            response.set_cookie(
                security.CSRF_COOKIE,
                fresh,
                httponly=True,
                samesite="strict",
                path="/",
                secure=request.url.scheme == "https",
            )
        return response

    return route


class FormTooLarge(Exception):
    pass


async def form(request: Request) -> dict[str, str]:
    """An urlencoded POST body's fields (the first value of each), read once and kept; at most
    MAX_FORM_BYTES."""
    if hasattr(request.state, "form"):
        return request.state.form  # type: ignore[no-any-return]  # Starlette: state is untyped
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge()
    lists = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    fields = {k: v[0] for k, v in lists.items()}
    request.state.form, request.state.form_lists = fields, lists
    return fields


async def form_all(request: Request, name: str) -> list[str]:
    """Every value of a field given more than once (the ticked rows' `id`), in order."""
    await form(request)
    return list(request.state.form_lists.get(name, ()))


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else age_text(seconds)


def _at(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _pretty(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return repr(value)


def _number(value: int) -> str:
    return f"{value:,}"
