"""`dispatcher` command line: migrate, grants, run, enqueue, status, jobs, limits, queues,
schedules, web, demo.

Worker settings come from `DISPATCHER_*` env vars, overridden by flags of the same name
(`DISPATCHER_BATCH_SIZE` / `--batch-size`). A bad setting exits with code 2 and names it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from typing import Any, NoReturn

import orjson

from dispatcher._version import __version__
from dispatcher.cli.enqueue import add_enqueue_parser
from dispatcher.cli.flow import add_flow_parsers
from dispatcher.cli.jobs import add_jobs_parser
from dispatcher.cli.schedules import add_schedules_parser
from dispatcher.cli.web import add_web_parser
from dispatcher.errors import (
    ConfigError,
    DispatcherError,
    SchemaMissing,
    StorePermissionDenied,
)
from dispatcher.observe import logs
from dispatcher.settings.config import Config, settings
from dispatcher.settings.meta import Setting
from dispatcher.settings.sections import DATABASE, ENQUEUE, LOGGING, WEB

EXIT_BAD_CONFIG = 2
# What `dispatcher demo` takes of the settings (devtools/demo.py): the rest it sets per run itself.
DEMO_SETTINGS = ("dsn", "concurrency", "batch_size", "log_level", "log_format")


# The settings a one-shot command reads: where and how to connect, and how to log. The others
# are read from the environment all the same (one Config), but only `run` shows their flags.
ONE_SHOT = (DATABASE, LOGGING)
# The one-shot commands that read jobs (status, jobs ...) say what DISPATCHER_COMPLETED_JOBS=delete
# hides from them: they show its flag too.
READERS_EXTRA = ("completed_jobs",)
WEB_EXTRA = ("mode", "coordinator", "coordinator_lease_s")
# A command group given no subcommand runs this one (read-only): `dispatcher limits` lists them.
DEFAULT_SUBCOMMANDS = {"jobs": "list", "limits": "list", "queues": "list", "schedules": "list"}


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad invocation is one line on stderr, `dispatcher <cmd>: error:
    <what>`, exit 2, without the usage block (`--help` prints it). Subcommands' parsers are of
    this class too (add_subparsers makes them of the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_CONFIG, f"{self.prog}: error: {' '.join(message.split())}\n")


def _add_config_flags(
    parser: argparse.ArgumentParser, chosen: tuple[Setting, ...] | None = None
) -> None:
    """The flags of `chosen` settings (default: every setting, for `run`)."""
    group = parser.add_argument_group("settings (each also DISPATCHER_<NAME> in the environment)")
    for s in settings() if chosen is None else chosen:
        # default=None: an absent flag leaves the env var (or the Config default) in charge,
        # so the default shown is the dataclass's, written into the text. argparse %-formats help.
        # A bare boolean flag means true (`--wait-for-schema`); `--steal false` still works.
        help_text = s.description.replace("%", "%%")
        if isinstance(s.default, bool):
            group.add_argument(
                s.flag,
                dest=s.name,
                default=None,
                metavar="V",
                help=help_text,
                nargs="?",
                const="true",
            )
        else:
            group.add_argument(s.flag, dest=s.name, default=None, metavar="V", help=help_text)


def _config_from(args: argparse.Namespace) -> Config:
    flags = {s.name: getattr(args, s.name, None) for s in settings()}
    config = Config.load(**flags)
    # Whatever quotes them, never in a line.
    logs.protect(
        config.dsn,
        config.listen_dsn,
        config.redis_url,
        tokens=(config.web_token, config.web_session_secret),
    )
    return config


def _require_dsn(config: Config) -> str:
    if not config.dsn:
        raise ConfigError(
            "DISPATCHER_DSN", "is not set (or pass --dsn); `dispatcher demo` runs without one"
        )
    return config.dsn


def load_registry(spec: str, origin: str = "--app") -> Any:
    """'package.module:attribute' -> the Registry object it names; errors name `origin` (the
    flag or env var the spec came from)."""
    from dispatcher.api.registry import Registry
    from dispatcher.api.schedules.slots import ScheduleError

    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(origin, f"expected 'module:attribute', got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        raise ConfigError(
            origin,
            f"no module named {module_name!r} (looked in the current directory and on sys.path)"
            if module_name == missing or module_name.startswith(missing + ".")
            else f"module {module_name!r} does not import: it needs module {missing!r}, which "
            "is not installed",
        ) from None
    except ScheduleError as exc:  # a schedule declared at import: its error names it
        raise ConfigError(origin, f"{module_name!r}: {exc}") from None
    except Exception as exc:  # the app's own code failed at import: say what, in one line
        raise ConfigError(
            origin, f"module {module_name!r} does not import: {_one_line(exc)}"
        ) from None
    if not hasattr(module, attribute):
        raise ConfigError(origin, f"module {module_name!r} has no attribute {attribute!r}")
    registry = getattr(module, attribute)
    if not isinstance(registry, Registry):
        raise ConfigError(
            origin,
            f"{spec!r} is a {type(registry).__name__}, not a dispatcher.Registry "
            "(name the Registry your handlers are registered on)",
        )
    try:
        registry.check_schedules()
    except ScheduleError as exc:
        raise ConfigError(origin, str(exc)) from None
    return registry


def _one_line(exc: BaseException) -> str:
    """`Type: message`, whitespace collapsed (a SyntaxError's text spans lines)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cmd_migrate(args: argparse.Namespace) -> int:
    from dispatcher.db.migrate import migrate

    dsn = _require_dsn(_config_from(args))
    applied = migrate(dsn)
    print(f"applied migrations: {applied}" if applied else "schema is up to date")
    if args.citus:
        from dispatcher.db.citus import distribute

        placed = distribute(dsn)
        print("citus: " + "; ".join(placed) if placed else "citus: already distributed by bucket")
    return 0


def cmd_grants(args: argparse.Namespace) -> int:
    from dispatcher.db.privileges import worker_grants

    for flag, value in (("--role", args.role), ("--schema", args.schema)):
        if not value.strip():
            raise ConfigError(flag, "must not be empty")
    script = worker_grants(args.role, args.schema)
    if not args.apply:
        print(script, end="")
        return 0
    from dispatcher.db.oneshot import bounded_transaction, session

    config = _config_from(args)
    try:
        with (
            session(
                _require_dsn(config), config.database.limits, application_name="dispatcher-grants"
            ) as conn,
            bounded_transaction(conn, "grants", config.database.limits),
        ):
            conn.execute(script.encode())  # bytes: run as a multi-statement script
    except (StorePermissionDenied, SchemaMissing) as exc:
        raise DispatcherError(
            f"{exc} (run them as the owner of the dispatcher tables, after `dispatcher migrate`)"
        ) from None
    print(f"granted the workers' privileges to {args.role}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from dispatcher.serve.lifecycle import install_early

    install_early()  # before the slow part of starting: a SIGTERM now still means a clean stop
    config = _config_from(args)  # logs nothing: the first line below already carries the worker id
    logs.set_worker(config.worker_id)
    from dispatcher.serve.health import Health
    from dispatcher.serve.http_server import HealthServer
    from dispatcher.serve.worker import run_worker

    _require_dsn(config)
    if config.worker.app is None:
        raise ConfigError(
            "DISPATCHER_APP",
            "is not set (or pass --app): module:attribute of your dispatcher.Registry",
        )
    registry = load_registry(
        config.worker.app, "--app" if args.app is not None else "DISPATCHER_APP"
    )
    logs.reinstall()  # the app's import may have configured logging (Django's LOGGING): ours stays
    # Probes answer from here on (not ready until the worker runs), through --migrate and the
    # start-up checks; port 0: no server.
    observability = config.observability
    health = Health(loop_stall_s=observability.loop_stall_s)
    server = (
        HealthServer(observability.metrics_port, health) if observability.metrics_port else None
    )
    if server is not None:
        server.start()
    try:
        if args.migrate:
            from dispatcher.db.migrate import migrate

            migrate(config.dsn)  # type: ignore[arg-type]  # set: checked before the worker starts
        worker = run_worker(config, registry, health=health)
    finally:
        if server is not None:
            server.stop()
    # Non-zero when some outcome could not be written before the deadline (1), or the worker gave
    # up on stuck handlers (3): those jobs come back by their leases.
    return worker.exit_code


def cmd_status(args: argparse.Namespace) -> int:
    from dispatcher.api.status import read_status, render_status

    config = _config_from(args)
    status = read_status(
        _require_dsn(config),
        config.database.limits,
        completed_jobs=config.completion.completed_jobs,
    )
    # OPT_NON_STR_KEYS: runnable_by_bucket is keyed by bucket number; JSON keys are strings
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    else:
        print(render_status(status))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dispatcher.devtools.demo import run_demo

    return run_demo(_config_from(args), jobs=args.jobs, workers=args.workers)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dispatcher", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__}",
        help="print the installed version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    one_shot = settings(*ONE_SHOT)
    p = sub.add_parser(
        "migrate", help="create or upgrade the schema (safe to run from N pods at once)"
    )
    _add_config_flags(p, one_shot)
    p.add_argument(
        "--citus",
        action="store_true",
        help="then distribute the jobs table over a Citus cluster, one shard per bucket",
    )
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "grants", help="print (or --apply) the GRANTs a DML-only workers' role needs"
    )
    p.add_argument("--role", required=True, help="the workers' role (it must exist)")
    p.add_argument(
        "--schema",
        default="public",
        help="the schema of the dispatcher tables (default %(default)s)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="run them on DISPATCHER_DSN (as the tables' owner, e.g. right after `dispatcher "
        "migrate`)",
    )
    _add_config_flags(p, one_shot)
    p.set_defaults(func=cmd_grants)

    p = sub.add_parser(
        "run", help="run a worker until SIGTERM/SIGINT (its app: --app or DISPATCHER_APP)"
    )
    p.add_argument("--migrate", action="store_true", help="run migrations before starting")
    _add_config_flags(p, tuple(s for s in settings() if s.section != WEB))
    p.set_defaults(func=cmd_run)

    add_enqueue_parser(
        sub,
        functools.partial(_add_config_flags, chosen=settings(*ONE_SHOT, ENQUEUE)),
        _config_from,
        _require_dsn,
    )

    readers = one_shot + tuple(s for s in settings() if s.name in READERS_EXTRA)
    p = sub.add_parser("status", help="jobs per status, oldest runnable age, backlog per bucket")
    p.add_argument("--json", action="store_true", help="print it as JSON instead of a table")
    _add_config_flags(p, readers)
    p.set_defaults(func=cmd_status)

    add_jobs_parser(sub, functools.partial(_add_config_flags, chosen=readers), _config_from)
    add_flow_parsers(sub, functools.partial(_add_config_flags, chosen=readers), _config_from)
    add_schedules_parser(sub, functools.partial(_add_config_flags, chosen=readers), _config_from)
    # The dashboard shows the mode and coordinator the workers run with: their flags too.
    web_settings = readers + tuple(s for s in settings() if s.name in WEB_EXTRA)
    add_web_parser(sub, functools.partial(_add_config_flags, chosen=web_settings), _config_from)

    p = sub.add_parser(
        "demo",
        help="both modes, a burst to a ready fleet and a cold start, on a throwaway PostgreSQL",
    )
    p.add_argument("--jobs", type=int, default=50_000, help="jobs per run (default %(default)s)")
    p.add_argument(
        "--workers", type=int, default=2, help="worker processes per mode (default %(default)s)"
    )
    _add_config_flags(p, tuple(s for s in settings() if s.name in DEMO_SETTINGS))
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(with_default_subcommand(argv))
    # Before any command runs, so its first line is in the chosen format. These raw values are
    # validated with the other settings (a bad one exits 2 naming it, in the format chosen here).
    # The worker id is known here only when it is given: else the run command sets it from its
    # config before anything logs. The one-shot commands run no worker: their lines have none.
    logs.configure(
        _raw_setting(args, "log_format"),
        _raw_setting(args, "log_level"),
        worker=_raw_setting(args, "worker_id") if args.func is cmd_run else None,
    )
    try:
        return int(args.func(args))
    except ConfigError as exc:
        logs.fatal(f"invalid setting {exc}")
        return EXIT_BAD_CONFIG
    except DispatcherError as exc:
        logs.fatal(str(exc))
        return 1


def with_default_subcommand(argv: list[str]) -> list[str]:
    """`dispatcher limits [flags]` -> `dispatcher limits list [flags]` (DEFAULT_SUBCOMMANDS): a
    group given only flags, or nothing, lists. `--help` still shows the group's help."""
    if not argv or argv[0] not in DEFAULT_SUBCOMMANDS:
        return argv
    rest = argv[1:]
    if rest and (not rest[0].startswith("-") or rest[0] in ("-h", "--help")):
        return argv
    return [argv[0], DEFAULT_SUBCOMMANDS[argv[0]], *rest]


def _raw_setting(args: argparse.Namespace, name: str) -> str | None:
    """A setting's flag, else its env var, unparsed (for what must be known before the config
    is)."""
    value = getattr(args, name, None)
    return value if value is not None else os.environ.get(f"DISPATCHER_{name.upper()}") or None


if __name__ == "__main__":
    sys.exit(main())
