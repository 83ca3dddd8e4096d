"""`dispatcher schedules list`: the recurring jobs (dispatcher/api/schedules/listing.py) on the
command line."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from dispatcher.api.schedules.listing import ScheduleRow, list_schedules
from dispatcher.cli.jobs import config_dsn, guarded


def add_schedules_parser(
    sub: Any,
    add_config_flags: Callable[[argparse.ArgumentParser], None],
    config_from: Callable[[argparse.Namespace], Any],
) -> None:
    schedules = sub.add_parser(
        "schedules",
        help="recurring jobs: their next slot, last run and its outcome (no subcommand: list)",
    )
    commands = schedules.add_subparsers(dest="schedules_command", required=True)
    p = commands.add_parser(
        "list", help="every schedule the workers declared, with its next slot and last run"
    )
    p.add_argument("--queue", default=None, help="only this queue's schedules")
    p.add_argument("--json", action="store_true", help="print them as JSON instead of a table")
    add_config_flags(p)
    p.set_defaults(func=lambda args: _list(args, config_from(args)))


def _list(args: argparse.Namespace, config: Any) -> int:
    rows = guarded(
        lambda: list_schedules(config_dsn(config), queue=args.queue, limits=config.database.limits),
        {"queue": "--queue"},
    )
    if args.json:
        print(
            orjson.dumps([dataclasses.asdict(r) for r in rows], option=orjson.OPT_INDENT_2).decode()
        )
    else:
        print(
            render_schedules(rows)
            if rows
            else "no schedules (none declared yet, or no worker started with them)"
        )
    return 0


def render_schedules(rows: list[ScheduleRow]) -> str:
    lines = [
        f"{'name':<24}{'cadence':<18}{'time zone':<18}{'queue':<12}"
        f"{'next slot':<22}{'last run':<22}{'outcome':<11}{'last success':<20}"
    ]
    for r in rows:
        nxt = "removed" if r.removed_at is not None else _at(r.next_slot_at)
        lines.append(
            f"{r.name:<24}{r.cadence:<18}{r.time_zone:<18}{r.queue:<12}{nxt:<22}{_at(r.last_slot_at):<22}"
            f"{r.last_outcome or '-':<11}{_at(r.last_success_at):<20}"
        )
    return "\n".join(lines)


def _at(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
