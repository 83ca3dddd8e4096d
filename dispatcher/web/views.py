"""The dashboard's pages (GET): overview, jobs and a job, workers, the bucket map, flow control and
schedules, and the probes. Each reads through web/reads.py or dispatcher.admin and renders a
template; filters come from the query string and are checked like the CLI's."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from dispatcher.admin import (
    SEARCH_WINDOW_IDS,
    AdminInputError,
    Filters,
    id_list,
    job_attempts,
    list_halted_keys,
    list_jobs,
    payload_filter,
    search_jobs,
    show_job,
)
from dispatcher.api.enqueue_checks import TAG_RE
from dispatcher.api.flow import list_limits, paused_queues
from dispatcher.api.job_filters import MAX_ID_LIST
from dispatcher.api.schedules.listing import list_schedules
from dispatcher.api.text import parse_duration_s
from dispatcher.constants import COMPLETED_DELETE, is_valid_name
from dispatcher.db.oneshot import bounded_transaction
from dispatcher.db.queries import query
from dispatcher.model import STATUSES
from dispatcher.web import chart_reads, charts, reads
from dispatcher.web.app import Dashboard

PAGE_SIZE = 50
FILTER_KEYS = (
    *("queue", "status", "type", "older_than", "newer_than", "tag"),
    *("payload", "error", "ids"),  # the search's
)
# What each status of a job allows, for the buttons of its page (the admin re-checks on the row).
ACTIONS_BY_STATUS = {
    "failed": ("retry", "cancel", "purge"),
    "discarded": ("retry", "cancel", "purge"),
    "queued": ("cancel",),
    "running": ("cancel",),
    "waiting": ("cancel",),
    "completed": ("purge",),
    "cancelled": ("purge",),
}
DONE = {
    "retried": "Retried: the job is queued again.",
    "cancelled": "Cancelled.",
    "cancel-requested": "Cancel requested: the worker running it stops it at its next check.",
    "purged": "Purged: the job's row is deleted.",
    "skipped": "Nothing changed: the job's status no longer allows it.",
    "paused": "Queue paused: workers claim nothing more from it.",
    "resumed": "Queue resumed.",
}


def _dash(request: Request) -> Dashboard:
    return request.app.state.dashboard  # type: ignore[no-any-return]  # Starlette: untyped state


def _span(request: Request) -> str:
    span = (request.query_params.get("span") or chart_reads.DEFAULT_SPAN).strip()
    if span not in chart_reads.SPANS:
        raise AdminInputError(f"unknown span {span!r} (one of 1h, 24h)", "span")
    return span


async def _overview_data(dash: Dashboard) -> reads.Overview:
    config = dash.config
    return await dash.db(  # type: ignore[no-any-return]
        reads.overview,
        dash.limits,
        mode=config.mode,
        coordinator=config.coordinator,
        completed_rows_kept=config.completion.completed_jobs != COMPLETED_DELETE,
        cache="overview",
    )


async def overview(request: Request) -> Response:
    dash = _dash(request)
    span = _span(request)
    data = await _overview_data(dash)
    series = await dash.db(chart_reads.read_series, dash.limits, span, cache=("charts", span))
    return dash.render(
        request,
        "overview.html",
        data=data,
        statuses=reads.DEPTH_STATUSES,
        window_s=reads.OUTCOME_WINDOW_S,
        charts=charts.charts_of(series),
        span=span,
    )


async def queue(request: Request) -> Response:
    """One queue: its counts (the overview's row) and its charts."""
    dash = _dash(request)
    name = request.path_params["name"]
    if not is_valid_name(name):
        return dash.error(request, 404, "No such queue: not a name a queue can have.")
    span = _span(request)
    data = await _overview_data(dash)
    series = await dash.db(
        chart_reads.read_series, dash.limits, span, name, cache=("charts", span, name)
    )
    return dash.render(
        request,
        "queue.html",
        data=data,
        row=next((q for q in data.queues if q.name == name), None),
        name=name,
        statuses=reads.DEPTH_STATUSES,
        window_s=reads.OUTCOME_WINDOW_S,
        charts=charts.charts_of(series),
        span=span,
    )


def filters_from(params: Any, *, before: bool = True) -> tuple[Filters, dict[str, str]]:
    """The jobs filters of a query string or form (AdminInputError names a bad one), and the
    values as given, to fill the form and the links in again."""
    given = {k: (params.get(k) or "").strip() for k in FILTER_KEYS}
    for key in ("queue", "type"):
        if given[key] and not is_valid_name(given[key]):
            raise AdminInputError(
                f"{given[key]!r} is not a name a job can have (letters, digits, _ . -)", key
            )
    if given["status"] and given["status"] not in STATUSES:
        raise AdminInputError(
            f"unknown status {given['status']!r} (one of {', '.join(STATUSES)})", "status"
        )
    ages: dict[str, float | None] = {}
    for key in ("older_than", "newer_than"):
        try:
            ages[key] = parse_duration_s(given[key]) if given[key] else None
        except ValueError as exc:
            raise AdminInputError(str(exc), key) from None
    # tag: comma-separated, as `--tag` takes them; jobs carrying every one
    tags = tuple(dict.fromkeys(t.strip() for t in given["tag"].split(",") if t.strip()))
    bad = [t for t in tags if TAG_RE.fullmatch(t) is None]
    if bad:
        raise AdminInputError(f"{bad[0]!r} is not a tag (letters, digits, _ . : -)", "tag")
    before_id = None
    if before and (params.get("before") or "").strip():
        try:
            before_id = int(params["before"])
        except ValueError:
            raise AdminInputError(f"a job id, got {params['before']!r}", "before") from None
    filters = Filters(
        statuses=(given["status"],) if given["status"] else (),
        queues=(given["queue"],) if given["queue"] else (),
        job_types=(given["type"],) if given["type"] else (),
        older_than_s=ages["older_than"],
        newer_than_s=ages["newer_than"],
        before_id=before_id,
        tags=tags,
        payload=payload_filter(given["payload"]) if given["payload"] else None,
        error=given["error"] or None,
        ids=id_list(given["ids"]),
    )
    return filters, {k: v for k, v in given.items() if v}


async def jobs(request: Request) -> Response:
    """The jobs that match, newest first, PAGE_SIZE a page. A search by payload or error text
    examines one window of SEARCH_WINDOW_IDS ids a page (admin.search_jobs), and says which."""
    dash = _dash(request)
    filters, given = filters_from(request.query_params)
    search = None
    if filters.payload is not None or filters.error is not None:
        search = await dash.db(
            search_jobs,
            filters,
            limit=PAGE_SIZE + 1,
            window=SEARCH_WINDOW_IDS,
            limits=dash.limits,
        )
        rows = search.jobs
    else:
        rows = await dash.db(list_jobs, filters, limit=PAGE_SIZE + 1, limits=dash.limits)
    more = len(rows) > PAGE_SIZE
    return dash.render(
        request,
        "jobs.html",
        rows=rows[:PAGE_SIZE],
        given=given,
        more=more,
        statuses=STATUSES,
        values={k: given.get(k, "") for k in FILTER_KEYS},
        first_page=filters.before_id is None,
        next_before=rows[PAGE_SIZE - 1].id if more else None,
        bulk=bool(given),
        search=search,
        max_selected=MAX_ID_LIST,
    )


async def job(request: Request) -> Response:
    dash = _dash(request)
    job_id = request.path_params["job_id"]
    if job_id < 1:
        return dash.error(request, 404, "No such job.")
    detail = await dash.db(show_job, job_id, limits=dash.limits)
    attempts = (
        detail.attempts if detail else await dash.db(job_attempts, job_id, limits=dash.limits)
    )
    done = DONE.get(request.query_params.get("done", ""))
    status = detail.job["status"] if detail else None
    if detail is None and not attempts:
        return dash.error(
            request,
            404,
            f"No job {job_id}: no row and no history (it was never enqueued, or it "
            "completed under DISPATCHER_COMPLETED_JOBS=delete, or it was pruned).",
        )
    return dash.render(
        request,
        "job.html",
        job_id=job_id,
        detail=detail,
        attempts=attempts,
        done=done,
        actions=ACTIONS_BY_STATUS.get(status or "", ()) if detail else (),
    )


async def workers(request: Request) -> Response:
    dash = _dash(request)
    fleet = await dash.db(
        reads.fleet, dash.limits, member_lease_s=dash.config.coordinator_lease_s, cache="workers"
    )
    return dash.render(
        request,
        "workers.html",
        fleet=fleet,
        groups=fleet.groups,
        coordinator=dash.config.coordinator,
        mode=dash.config.mode,
    )


async def buckets(request: Request) -> Response:
    dash = _dash(request)
    names = await dash.db(reads.queue_names, dash.limits, cache="queues")
    queue = (request.query_params.get("queue") or (names[0] if names else "default")).strip()
    if not is_valid_name(queue):
        raise AdminInputError(f"{queue!r} is not a queue name", "queue")
    grid = await dash.db(
        reads.bucket_map,
        dash.limits,
        queue,
        member_lease_s=dash.config.coordinator_lease_s,
        cache=("buckets", queue),
    )
    return dash.render(
        request, "buckets.html", grid=grid, queues=names, queue=queue, cap=reads.BACKLOG_CAP
    )


def _flow(conn: Any, limits: Any) -> dict[str, Any]:
    # One connection for the four reads; each function bounds its own transaction.
    return {
        "limits": list_limits(conn, limits=limits),
        "paused": paused_queues(conn, limits=limits),
        "halted": list_halted_keys(conn, Filters(halted=True), limit=PAGE_SIZE, limits=limits),
        "schedules": list_schedules(conn, limits=limits),
    }


async def flow(request: Request) -> Response:
    dash = _dash(request)
    data = await dash.db(_flow, dash.limits, cache="flow")
    return dash.render(
        request, "flow.html", done=DONE.get(request.query_params.get("done", "")), **data
    )


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def readyz(request: Request) -> Response:
    """200 when the database answers a trivial statement within its bound, else 503."""
    dash = _dash(request)

    def ping(conn: Any) -> None:
        with bounded_transaction(conn, "dashboard ready", dash.limits):
            conn.execute(query("ping"), prepare=False)

    try:
        await dash.db(ping)
    except Exception as exc:
        return PlainTextResponse(f"not ready: {type(exc).__name__}", status_code=503)
    return PlainTextResponse("ready")
