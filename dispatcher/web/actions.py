"""The dashboard's changes (POST), each through dispatcher.admin: retry, cancel or purge one job;
the same for the jobs ticked on the jobs page (each re-checked on its row, each reported); the
same for every job a filter matches, after a page that says how many match (and fixes the
newest id and the instant, so jobs that arrive or change later are left alone); pause and resume
a queue; log in and out. A bulk change stops after BULK_TIME_S, or when the dashboard stops, and
says how far it got.

Every POST has passed the CSRF check (app.guarded) before it gets here; the changes also need
--allow-actions (DISPATCHER_WEB_ALLOW_ACTIONS), else they are refused with 403.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from dispatcher.admin import (
    AdminInputError,
    AdminResult,
    Filters,
    cancel_jobs,
    id_list,
    match_jobs,
    purge_jobs,
    retry_jobs,
)
from dispatcher.api.flow import pause_queue, resume_queue
from dispatcher.api.job_filters import MAX_ID_LIST
from dispatcher.constants import is_valid_name
from dispatcher.web import security
from dispatcher.web.app import form, form_all
from dispatcher.web.views import _dash, filters_from

CHANGES = {"retry": retry_jobs, "cancel": cancel_jobs, "purge": purge_jobs}
DONE = {"retry": "retried", "cancel": "cancelled", "purge": "purged"}
BULK_TIME_S = 20.0  # one request's share of a bulk change; the rest is confirmed again
NO_FILTER = (
    "a bulk change needs at least one filter (queue, status, type, age, tag, payload, error text "
    "or ids)"
)
READ_ONLY = (
    "This dashboard is read-only: start it with --allow-actions "
    "(DISPATCHER_WEB_ALLOW_ACTIONS=true) to change jobs."
)


def _action(request: Request) -> str:
    action = request.path_params.get("action") or request.query_params.get("action") or ""
    if action not in CHANGES:
        raise AdminInputError(f"unknown action {action!r} (retry, cancel or purge)", "action")
    return action


async def job_action(request: Request) -> Response:
    dash = _dash(request)
    if not dash.allow_actions:
        return dash.error(request, 403, READ_ONLY)
    action, job_id = _action(request), request.path_params["job_id"]
    result = await dash.db(CHANGES[action], Filters(ids=(job_id,)), limits=dash.limits)
    dash.forget()
    done = (
        "skipped"
        if result.skipped
        else "cancel-requested"
        if result.requested_count
        else DONE[action]
    )
    return RedirectResponse(f"/jobs/{job_id}?done={done}", status_code=303)


async def selected_action(request: Request) -> Response:
    """The jobs ticked on the jobs page (repeated `id` fields, at most MAX_ID_LIST): exactly
    those, each re-checked on its row; the page after lists which changed and which were
    skipped, and why."""
    dash = _dash(request)
    if not dash.allow_actions:
        return dash.error(request, 403, READ_ONLY)
    action = _action(request)
    ticked = await form_all(request, "id")
    if len(ticked) > MAX_ID_LIST:
        raise AdminInputError(
            f"at most {MAX_ID_LIST} jobs at once, {len(ticked)} were ticked: narrow the "
            "filters, or use a bulk change",
            "id",
        )
    ids = id_list(" ".join(ticked), "id")
    if not ids:
        raise AdminInputError(f"tick the jobs to {action} first", "id")
    _, given = filters_from(await form(request), before=False)  # the page to go back to
    result = await dash.db(CHANGES[action], Filters(ids=ids), limits=dash.limits)
    dash.forget()
    return _result(request, result, given)


def _result(
    request: Request, result: AdminResult, given: dict[str, str], again: str = ""
) -> Response:
    """The page after a change: what it did, and a link back to the jobs as filtered. A bulk
    change's links to a new count of the rest (`again`); a selection's lists each job's outcome."""
    return _dash(request).render(
        request,
        "result.html",
        action=result.action,
        done=DONE[result.action],
        result=result,
        back=f"/jobs?{urlencode(given)}",
        again=again,
        bulk_time_s=int(BULK_TIME_S),
        selected=not again,
    )


async def confirm(request: Request) -> Response:
    """GET: how many jobs a bulk change would touch, and the form that does it."""
    dash = _dash(request)
    if not dash.allow_actions:
        return dash.error(request, 403, READ_ONLY)
    action = _action(request)
    filters, given = filters_from(request.query_params, before=False)
    if not given:
        raise AdminInputError(NO_FILTER, "filters")
    match = await dash.db(match_jobs, filters, action, limits=dash.limits)
    return dash.render(
        request,
        "confirm.html",
        action=action,
        done=DONE[action],
        given=given,
        matching=match.count,
        up_to_id=match.newest_id,
        as_of=match.as_of.isoformat(),
        back=f"/jobs?{urlencode(given)}",
    )


async def bulk_action(request: Request) -> Response:
    dash = _dash(request)
    if not dash.allow_actions:
        return dash.error(request, 403, READ_ONLY)
    action = _action(request)
    fields = await form(request)
    filters, given = filters_from(fields, before=False)
    if not given:
        raise AdminInputError(NO_FILTER, "filters")
    try:
        up_to_id = int(fields.get("up_to_id", ""))
        as_of = datetime.fromisoformat(fields.get("as_of", ""))
        if as_of.tzinfo is None:
            raise ValueError("no time zone")
    except ValueError:
        raise AdminInputError(
            "the confirmation lost what it counted: start again from the jobs page", "up_to_id"
        ) from None
    deadline = time.monotonic() + BULK_TIME_S

    def keep_going() -> bool:
        return not dash.stopping and time.monotonic() < deadline

    result = await dash.db(
        CHANGES[action],
        replace(filters, as_of=as_of),
        up_to_id=up_to_id,
        limits=dash.limits,
        keep_going=keep_going,
    )
    dash.forget()
    return _result(
        request, result, given, f"/actions/confirm?{urlencode({**given, 'action': action})}"
    )


async def queue_action(request: Request) -> Response:
    dash = _dash(request)
    if not dash.allow_actions:
        return dash.error(request, 403, READ_ONLY)
    action = request.path_params["action"]
    if action not in ("pause", "resume"):
        return dash.error(request, 404, "No such page.")
    queue = (await form(request)).get("queue", "").strip()
    if not is_valid_name(queue):
        raise AdminInputError(f"{queue!r} is not a queue name (letters, digits, _ . -)", "queue")
    await dash.db(pause_queue if action == "pause" else resume_queue, queue, limits=dash.limits)
    dash.forget()
    return RedirectResponse(f"/flow?{urlencode({'done': action + 'd'})}", status_code=303)


async def login_page(request: Request) -> Response:
    dash = _dash(request)
    if dash.gate.open:
        return RedirectResponse("/", status_code=303)
    return dash.render(request, "login.html", failed=False)


async def login(request: Request) -> Response:
    dash = _dash(request)
    if dash.gate.open:
        return RedirectResponse("/", status_code=303)
    if not dash.gate.token_matches((await form(request)).get("token")):
        return dash.render(request, "login.html", status=401, failed=True)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        security.SESSION_COOKIE,
        dash.gate.login(),
        max_age=security.SESSION_TTL_S,
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request) -> Response:
    dash = _dash(request)
    # Stateless: this browser forgets its cookie; a copy of it works until it expires.
    response = RedirectResponse("/login" if not dash.gate.open else "/", status_code=303)
    response.delete_cookie(security.SESSION_COOKIE, path="/")
    return response
