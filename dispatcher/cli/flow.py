"""`dispatcher limits set|list|clear` and `dispatcher queues pause|resume|list`: the fleet's flow
control (dispatcher/api/flow.py) on the command line. Exit codes: 0 done, 1 nothing to do (clear
found no limit, pause found the queue paused already), 2 bad input."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import orjson

from dispatcher.api.flow import (
    ANY,
    LimitRow,
    clear_limits,
    list_limits,
    pause_queue,
    paused_queues,
    resume_queue,
    set_limit,
)
from dispatcher.cli.jobs import config_dsn, guarded
from dispatcher.errors import ConfigError

_FLAGS = {
    "job_type": "JOB_TYPE",
    "queue": "--queue",
    "max_running": "--max-running",
    "per_second": "--per-second",
    "burst_jobs": "--burst",
}


def add_flow_parsers(
    sub: Any,
    add_config_flags: Callable[[argparse.ArgumentParser], None],
    config_from: Callable[[argparse.Namespace], Any],
) -> None:
    """Register `dispatcher limits ...` and `dispatcher queues ...` on the top-level subparsers."""
    limits = sub.add_parser(
        "limits",
        help="fleet-wide limits per job type and queue: max running, starts per second (no "
        "subcommand: list them)",
    )
    commands = limits.add_subparsers(dest="limits_command", required=True)
    p = commands.add_parser(
        "set", help="set (or replace) the limit on a job type ('*': every type)"
    )
    p.add_argument("job_type", help="the job type, or '*' for every type of the queue")
    p.add_argument("--queue", default=None, help="only in this queue (default: in every queue)")
    p.add_argument(
        "--max-running", type=int, default=None, help="at most this many run at once, fleet-wide"
    )
    p.add_argument(
        "--per-second",
        type=float,
        default=None,
        help="at most this many start per second, fleet-wide",
    )
    p.add_argument(
        "--burst",
        type=float,
        default=None,
        help="with --per-second: how many may start at once after a quiet spell (default: one "
        "second's worth, at least 1)",
    )
    add_config_flags(p)
    p.set_defaults(func=lambda args: _set(args, config_from(args)))

    p = commands.add_parser("list", help="the limits, with what runs under each now")
    p.add_argument("--json", action="store_true", help="print them as JSON instead of a table")
    add_config_flags(p)
    p.set_defaults(func=lambda args: _list(args, config_from(args)))

    p = commands.add_parser(
        "clear", help="remove the limits on a job type (all its queues, or --queue)"
    )
    p.add_argument(
        "job_type", nargs="?", default=None, help="the job type ('*': the every-type limit)"
    )
    p.add_argument(
        "--queue", default=None, help="only the limit in this queue ('*': the every-queue one)"
    )
    p.add_argument("--all", action="store_true", help="remove every limit")
    add_config_flags(p)
    p.set_defaults(func=lambda args: _clear(args, config_from(args)))

    queues = sub.add_parser(
        "queues", help="pause or resume a queue across the fleet (no subcommand: list the paused)"
    )
    commands = queues.add_subparsers(dest="queues_command", required=True)
    for action, what in (
        ("pause", "no worker claims the queue's jobs (running ones finish; enqueue goes on)"),
        ("resume", "workers claim the queue's jobs again"),
    ):
        p = commands.add_parser(action, help=what)
        p.add_argument("queue", help="the queue")
        add_config_flags(p)
        p.set_defaults(func=lambda args, action=action: _pause(args, config_from(args), action))
    p = commands.add_parser("list", help="the paused queues")
    p.add_argument("--json", action="store_true", help="print them as JSON")
    add_config_flags(p)
    p.set_defaults(func=lambda args: _paused(args, config_from(args)))


def _set(args: argparse.Namespace, config: Any) -> int:
    row = _guarded(
        lambda: set_limit(
            config_dsn(config),
            args.job_type,
            queue=args.queue,
            max_running=args.max_running,
            per_second=args.per_second,
            burst_jobs=args.burst,
            limits=config.database.limits,
        )
    )
    print(f"limit set: {describe_limit(row)}")
    return 0


def _list(args: argparse.Namespace, config: Any) -> int:
    rows = _guarded(lambda: list_limits(config_dsn(config), limits=config.database.limits))
    if args.json:
        print(
            orjson.dumps([dataclasses.asdict(r) for r in rows], option=orjson.OPT_INDENT_2).decode()
        )
    else:
        print(render_limits(rows) if rows else "no limits")
    return 0


def _clear(args: argparse.Namespace, config: Any) -> int:
    if args.job_type is None and args.queue is None and not args.all:
        raise ConfigError("JOB_TYPE", "give a job type, --queue, or --all (limits clear)")
    gone = _guarded(
        lambda: clear_limits(
            config_dsn(config), args.job_type, queue=args.queue, limits=config.database.limits
        )
    )
    print(
        f"cleared {len(gone)} limits"
        + (": " + ", ".join(f"{t} in {_queue(q)}" for t, q in gone) if gone else "")
    )
    return 0 if gone else 1


def _pause(args: argparse.Namespace, config: Any, action: str) -> int:
    change = pause_queue if action == "pause" else resume_queue
    changed = guarded(  # the queue is an argument here, not --queue
        lambda: change(config_dsn(config), args.queue, limits=config.database.limits),
        {**_FLAGS, "queue": "QUEUE"},
    )
    past = "paused" if action == "pause" else "resumed"
    print(
        f"queue {args.queue!r} {past}"
        if changed
        else f"queue {args.queue!r} was {'paused already' if action == 'pause' else 'not paused'}: "
        "nothing changed"
    )
    return 0 if changed else 1


def _paused(args: argparse.Namespace, config: Any) -> int:
    rows = _guarded(lambda: paused_queues(config_dsn(config), limits=config.database.limits))
    if args.json:
        print(orjson.dumps([dataclasses.asdict(r) for r in rows]).decode())
    else:
        print(
            "\n".join(
                f"{r.queue:<24} paused since {r.paused_at:%Y-%m-%d %H:%M:%S %Z}" for r in rows
            )
            or "no paused queues"
        )
    return 0


def _guarded(work: Callable[[], Any]) -> Any:
    return guarded(work, _FLAGS)


def render_limits(rows: list[LimitRow]) -> str:
    lines = [
        f"{'job type':<24}{'queue':<16}{'max running':>12}{'running':>9}"
        f"{'per second':>12}{'burst':>8}{'tokens':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r.job_type:<24}{_queue(r.queue):<16}{_opt(r.max_running):>12}{r.running:>9}"
            f"{_opt(r.per_second):>12}{_opt(r.burst_jobs if r.per_second else None):>8}"
            f"{_opt(None if r.tokens is None else round(r.tokens, 1)):>8}"
        )
    return "\n".join(lines)


def describe_limit(row: LimitRow) -> str:
    """One limit as a labelled line: `job type 'send' in every queue: max running 5, per second
    2 (burst 4); 3 running now`."""
    rules = []
    if row.max_running is not None:
        rules.append(f"max running {row.max_running}")
    if row.per_second is not None:
        rules.append(f"per second {_opt(row.per_second)} (burst {_opt(row.burst_jobs)})")
    where = "every queue" if row.queue == ANY else f"queue {row.queue!r}"
    what = "every job type" if row.job_type == ANY else f"job type {row.job_type!r}"
    return f"{what} in {where}: {', '.join(rules)}; {row.running} running now"


def _queue(queue: str) -> str:
    return "(every queue)" if queue == ANY else queue


def _opt(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
