"""`dispatcher web`: the dashboard (dispatcher/web/, the `web` extra) on the command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dispatcher.errors import ConfigError


def add_web_parser(
    sub: Any,
    add_config_flags: Callable[[argparse.ArgumentParser], None],
    config_from: Callable[[argparse.Namespace], Any],
) -> None:
    p = sub.add_parser(
        "web", help="the web dashboard: queues, jobs, workers, the bucket map (the `web` extra)"
    )
    # The web settings under short names (each also DISPATCHER_WEB_*); the token and the session
    # secret only from the environment (DISPATCHER_WEB_TOKEN, DISPATCHER_WEB_SESSION_SECRET): a
    # flag would show them to anyone who can list processes.
    p.add_argument(
        "--host",
        dest="web_host",
        default=None,
        help="address to listen on (default 127.0.0.1; DISPATCHER_WEB_HOST); one that is not "
        "loopback needs DISPATCHER_WEB_TOKEN, or --insecure",
    )
    p.add_argument(
        "--port", dest="web_port", default=None, help="TCP port (default 8080; DISPATCHER_WEB_PORT)"
    )
    p.add_argument(
        "--allow-actions",
        dest="web_allow_actions",
        action="store_const",
        const="true",
        default=None,
        help="show and accept retry, cancel, purge, pause and resume (default: read-only; "
        "DISPATCHER_WEB_ALLOW_ACTIONS)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a non-loopback address without DISPATCHER_WEB_TOKEN (only behind a proxy "
        "that checks who comes in)",
    )
    add_config_flags(p)
    p.set_defaults(func=lambda args: _web(args, config_from(args)))


def _web(args: argparse.Namespace, config: Any) -> int:
    if not config.dsn:
        raise ConfigError("DISPATCHER_DSN", "is not set (or pass --dsn)")
    try:
        from dispatcher.web.server import serve
    except ImportError as exc:
        raise ConfigError(
            "dispatcher web", f"needs the web extra: pip install 'bucket-dispatcher[web]' ({exc})"
        ) from None
    return serve(config, insecure=args.insecure)
