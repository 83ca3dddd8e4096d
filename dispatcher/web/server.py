"""`dispatcher web`: checks where it may listen, then serves the dashboard with uvicorn until
SIGTERM or SIGINT, and stops within a bound (open requests get SHUTDOWN_GRACE_S, and a bulk
change stops at its next batch; the pool two seconds more), exiting 0."""

from __future__ import annotations

import logging
import signal
from types import FrameType

from dispatcher.settings.config import Config
from dispatcher.web.security import check_bind

log = logging.getLogger("dispatcher.web")

SHUTDOWN_GRACE_S = 5
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 200  # beyond this uvicorn answers 503 at once instead of queueing


def serve(config: Config, *, insecure: bool = False) -> int:
    """Serve until stopped; a refused address is a ConfigError (exit 2), raised before binding."""
    import uvicorn

    from dispatcher.web.routes import create_app

    web = config.web
    check_bind(web.host, web.token, insecure)
    # uvicorn's start-up lines repeat ours below; its warnings and errors (a failed request) stay.
    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    app = create_app(config, insecure=insecure)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # a bulk change in a request stops at its next batch
            app.state.dashboard.stopping = True
            super().handle_exit(sig, frame)

    server = Server(
        uvicorn.Config(
            app,
            host=web.host,
            port=web.port,
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
            lifespan="on",
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            limit_concurrency=MAX_CONNECTIONS,
        )
    )
    shown = f"[{web.host}]" if ":" in web.host else web.host
    log.info(
        "dashboard on http://%s:%d (%s%s)",
        shown,
        web.port,
        "actions allowed" if web.allow_actions else "read-only",
        ", token required"
        if web.token
        else (", no login: --insecure" if insecure else ", loopback only"),
    )

    # uvicorn traps SIGTERM and SIGINT while it serves, then sends the signal again once it has
    # stopped, to the handler that was in place before: this one, so the command exits 0 after a
    # clean stop. A signal before uvicorn's own handlers are in place stops it all the same.
    def stop(signum: int, frame: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("dashboard stopped")
    return 0
