"""The dashboard's application: its routes, each behind app.guarded, its static files, and the
pool that opens and closes with it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg_pool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dispatcher.settings.config import Config
from dispatcher.web import actions, security, views
from dispatcher.web.app import HERE, POOL_MAX, POOL_WAIT_S, Dashboard, guarded

POOL_CLOSE_S = 2.0


def create_app(config: Config, *, insecure: bool = False) -> Starlette:
    """The dashboard for `config` (its database and web settings); the pool opens with the app.
    `insecure`: started with --insecure, so requests may name any host."""
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        config.dsn or "",
        min_size=1,
        max_size=POOL_MAX,
        open=False,
        name="dispatcher-web",
        timeout=POOL_WAIT_S,
        max_idle=300,
        reconnect_timeout=0,
        check=psycopg_pool.ConnectionPool.check_connection,
        kwargs={
            "autocommit": True,
            "application_name": "dispatcher-web",
            "prepare_threshold": None,
            **config.database.limits.connect_kwargs(),
        },
    )
    dashboard = Dashboard(config, pool=pool, insecure=insecure)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool.open(wait=False)
        try:
            yield
        finally:
            dashboard.stopping = True
            await run_in_threadpool(pool.close, POOL_CLOSE_S)

    public = {"public": True}
    routes = [
        Route("/", guarded(views.overview)),
        Route("/jobs", guarded(views.jobs)),
        Route("/jobs/{job_id:int}", guarded(views.job)),
        Route(
            "/jobs/{job_id:int}/{action}", guarded(actions.job_action, post=True), methods=["POST"]
        ),
        Route("/workers", guarded(views.workers)),
        Route("/buckets", guarded(views.buckets)),
        Route("/flow", guarded(views.flow)),
        Route("/actions/confirm", guarded(actions.confirm)),
        Route("/actions/{action}", guarded(actions.bulk_action, post=True), methods=["POST"]),
        Route(
            "/actions/{action}/selected",
            guarded(actions.selected_action, post=True),
            methods=["POST"],
        ),
        Route("/queues/{action}", guarded(actions.queue_action, post=True), methods=["POST"]),
        Route("/login", guarded(actions.login_page, **public)),
        Route("/login", guarded(actions.login, post=True, **public), methods=["POST"]),
        Route("/logout", guarded(actions.logout, post=True, **public), methods=["POST"]),
        Route("/healthz", views.healthz),
        Route("/readyz", views.readyz),
        Route("/queues/{name}", guarded(views.queue)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes, middleware=[Middleware(security.SecurityHeaders)], lifespan=lifespan
    )
    app.state.dashboard = dashboard
    return app
