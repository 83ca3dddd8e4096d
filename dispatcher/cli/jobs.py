"""`dispatcher jobs list|show|retry|cancel|purge`: the failed-job admin (dispatcher/admin.py)
on the command line.

Which jobs: ids (arguments, or --id repeated), and/or filters (--status, --queue, --type, each
repeated or comma-separated; --older-than / --newer-than an age in seconds or 90s, 10m, 2h, 7d,
by the time the job entered its status; --halted: jobs that halt their ordering key; --tag: jobs
carrying every tag given, repeated or comma-separated; --payload: jobs whose payload contains
key=value pairs or a JSON object; --error: jobs whose last error contains a text, in any case).
A change given ids acts at once and reports each id. A change without ids is a bulk change of
every job that matches (--all: no filter at all); it first prints how many match, and acts only
with --yes: without it nothing changes and the exit code is 1, so a script that forgot --yes does
not take "nothing done" for success.

Exit codes (0 done, 1 not done, 2 bad input): docs/guides/admin.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, TypeVar

import orjson

from dispatcher.admin import (
    DEFAULT_BATCH,
    DEFAULT_LIST_LIMIT,
    AdminInputError,
    AdminResult,
    Attempt,
    Filters,
    HaltedKey,
    JobDetail,
    JobRow,
    cancel_jobs,
    count_jobs,
    job_attempts,
    list_halted_keys,
    list_jobs,
    payload_filter,
    purge_jobs,
    retry_jobs,
    show_job,
)
from dispatcher.api.text import age_text, parse_duration_s
from dispatcher.errors import ConfigError, DispatcherError
from dispatcher.model import STATUS_COMPLETED, STATUSES

_T = TypeVar("_T")

_FLAGS = {
    "statuses": "--status",
    "queues": "--queue",
    "job_types": "--type",
    "older_than_s": "--older-than",
    "newer_than_s": "--newer-than",
    "ids": "ids",
    "halted": "--halted",
    "tags": "--tag",
    "payload": "--payload",
    "error": "--error",
    "limit": "--limit",
    "batch": "--batch",
    "batch_id": "--batch",
}
_CHANGES = {
    "retry": (retry_jobs, "retried", "put back to queued"),
    "cancel": (cancel_jobs, "cancelled", "cancelled"),
    "purge": (purge_jobs, "purged", "deleted"),
}
_ERROR_CHARS = 60  # of the last error's last line, in the list table
# What a running handler reported (Job.set_progress, update_meta) and what it returned (its
# result): shown as JSON, once there.
_REPORTED = ("progress", "meta", "result")
_TAGS_CHARS = 24  # of a job's tags, in the list table


def add_jobs_parser(
    sub: Any,
    add_config_flags: Callable[[argparse.ArgumentParser], None],
    config_from: Callable[[argparse.Namespace], Any],
) -> None:
    """Register `dispatcher jobs ...` on the top-level subparsers."""
    jobs = sub.add_parser(
        "jobs",
        help="list, show, retry, cancel or purge jobs (failed-job admin; no subcommand: list)",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    commands = jobs.add_subparsers(dest="jobs_command", required=True)

    p = commands.add_parser(
        "list", help="jobs that match, newest first (--halted: the halted ordering keys)"
    )
    _add_selection(p)
    p.add_argument(
        "--batch",
        default=None,
        metavar="ID",
        help="only the jobs of this batch and its callback (the batch's id: the callback's)",
    )
    p.add_argument(
        "--limit", default=str(DEFAULT_LIST_LIMIT), help="most jobs listed (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print them as JSON instead of a table")
    add_config_flags(p)
    p.set_defaults(func=lambda args: _list(args, config_from(args)))

    p = commands.add_parser("show", help="one job: its row, last error and attempt history")
    p.add_argument("id", help="the job's id")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    add_config_flags(p)
    p.set_defaults(func=lambda args: _show(args, config_from(args)))

    for action, what in (
        (
            "retry",
            "failed or discarded jobs back to queued, due now (one with an ordering key "
            "runs before the later jobs of its key)",
        ),
        (
            "cancel",
            "queued and waiting jobs, and jobs that halt their ordering key: cancelled at "
            "once; running ones: cancelled at their next heartbeat",
        ),
        ("purge", "delete finished jobs (completed, failed, discarded, cancelled)"),
    ):
        p = commands.add_parser(action, help=what)
        _add_selection(p)
        p.add_argument("--all", action="store_true", help="every job it applies to, with no filter")
        p.add_argument(
            "--yes",
            action="store_true",
            help="do a bulk change (without ids); without it, only count",
        )
        p.add_argument(
            "--batch",
            default=str(DEFAULT_BATCH),
            help="most jobs changed per statement (default %(default)s)",
        )
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        add_config_flags(p)
        p.set_defaults(func=lambda args, action=action: _change(args, config_from(args), action))


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("ids", nargs="*", help="job ids")
    p.add_argument(
        "--id",
        action="append",
        default=[],
        dest="id_flags",
        metavar="ID",
        help="a job id (repeatable)",
    )
    p.add_argument(
        "--status",
        action="append",
        default=[],
        metavar="S",
        help=f"only jobs in this status (repeatable, or comma-separated): {', '.join(STATUSES)}",
    )
    p.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="Q",
        help="only jobs of this queue (repeatable)",
    )
    p.add_argument(
        "--type",
        action="append",
        default=[],
        dest="job_type",
        metavar="T",
        help="only jobs of this job type (repeatable)",
    )
    p.add_argument(
        "--older-than",
        default=None,
        metavar="AGE",
        help="only jobs in their status for longer than this: seconds, or 90s, 10m, 2h, 7d",
    )
    p.add_argument(
        "--newer-than",
        default=None,
        metavar="AGE",
        help="only jobs in their status for at most this",
    )
    p.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="TAG",
        help="only jobs carrying this tag (repeatable, or comma-separated: jobs carrying all)",
    )
    p.add_argument(
        "--payload",
        default=None,
        metavar="MATCH",
        help="only jobs whose payload contains this: key=value pairs (customer.id=5 order=8812; a "
        'bare number also matches its text, "8812") or a JSON object',
    )
    p.add_argument(
        "--error",
        default=None,
        metavar="TEXT",
        help="only jobs whose last error contains this text (any case)",
    )
    p.add_argument(
        "--halted",
        action="store_true",
        help="only failed or discarded jobs that halt their ordering key (list: one row per halted "
        "key)",
    )


# -- commands --------------------------------------------------------------------------------------


def _list(args: argparse.Namespace, config: Any) -> int:
    filters = _filters(args)
    if args.batch is not None:
        filters = replace(filters, batch_id=_whole(args.batch, "--batch"))
    limit = _whole(args.limit, "--limit")
    # One row more than asked for: whether the list was cut short, said rather than left to guess.
    if filters.halted:
        keys = guarded(
            lambda: list_halted_keys(
                config_dsn(config), filters, limit=limit + 1, limits=config.database.limits
            )
        )
        more = len(keys) > limit
        keys = keys[:limit]
        print(
            orjson.dumps(keys, option=orjson.OPT_INDENT_2).decode()
            if args.json
            else render_halted(keys)
        )
        if more:
            _note(f"showing the first {limit} halted keys; there are more: {MORE_HINT}", args.json)
        return 0
    rows = guarded(
        lambda: list_jobs(
            config_dsn(config), filters, limit=limit + 1, limits=config.database.limits
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    # Completed jobs have no rows to list under DISPATCHER_COMPLETED_JOBS=delete: say so, not "(no
    # jobs match)".
    hidden = config.completion.deletes and (
        not filters.statuses or STATUS_COMPLETED in filters.statuses
    )
    print(
        orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() if args.json else render_list(rows)
    )
    if more:
        _note(f"showing the newest {limit} jobs that match; there are more: {MORE_HINT}", args.json)
    if hidden:
        _note(DELETED_LIST_NOTE, args.json)
    return 0


# A list cut at --limit says so. Its JSON stays a bare array (what scripts already parse): the
# note goes to stderr there, and to the end of the table otherwise.
MORE_HINT = "raise --limit, or narrow the filters"
ATTEMPTS_SHOWN = 100  # of a job's attempt history, the first ones


def _note(text: str, json: bool) -> None:
    print(f"note: {text}", file=sys.stderr if json else sys.stdout)


DELETED_LIST_NOTE = (
    "completed jobs are not listed: DISPATCHER_COMPLETED_JOBS=delete deletes a job's row when it "
    "completes (only rows completed before that was set remain)"
)


def _show(args: argparse.Namespace, config: Any) -> int:
    job_id = _whole(args.id, "id")
    dsn, limits = config_dsn(config), config.database.limits
    shown = ATTEMPTS_SHOWN + 1  # one more: whether the history was cut short
    detail = guarded(lambda: show_job(dsn, job_id, attempts_limit=shown, limits=limits))
    if detail is not None:
        more = len(detail.attempts) > ATTEMPTS_SHOWN
        detail = replace(detail, attempts=detail.attempts[:ATTEMPTS_SHOWN])
        print(
            orjson.dumps(
                {**_fields(detail), "attempts_truncated": more}, option=orjson.OPT_INDENT_2
            ).decode()
            if args.json
            else render_show(detail)
        )
        if more:
            _note(f"showing the first {ATTEMPTS_SHOWN} attempts; there are more", args.json)
        return 0
    # No row. Under DISPATCHER_COMPLETED_JOBS=delete that is what a completed job leaves; the
    # history (DISPATCHER_HISTORY) may still tell what became of it (and of a pruned or purged one).
    attempts = guarded(lambda: job_attempts(dsn, job_id, limit=shown, limits=limits))
    more = len(attempts) > ATTEMPTS_SHOWN
    attempts = attempts[:ATTEMPTS_SHOWN]
    if attempts:
        print(
            orjson.dumps(
                {"id": job_id, "job": None, "attempts": attempts, "attempts_truncated": more},
                option=orjson.OPT_INDENT_2,
            ).decode()
            if args.json
            else render_attempts(attempts, f"job {job_id}: no row; its attempts from the history")
        )
        if more:
            _note(f"showing the first {ATTEMPTS_SHOWN} attempts; there are more", args.json)
    why = ""
    if config.completion.deletes:
        why = (
            ": DISPATCHER_COMPLETED_JOBS=delete deletes a job's row when it completes, so it may "
            "have completed"
            + ("" if attempts else " (its attempts are kept only with DISPATCHER_HISTORY=true)")
        )
    elif attempts:
        why = (
            ": its row was deleted (completed and deleted, pruned or purged); its attempts are "
            "above"
        )
    raise DispatcherError(f"no job {job_id}{why}")  # one line on stderr, exit 1


def _fields(detail: JobDetail) -> dict[str, Any]:
    """A JobDetail as the dict orjson would write for it (its fields, not converted)."""
    return {f.name: getattr(detail, f.name) for f in fields(detail)}


def _change(args: argparse.Namespace, config: Any, action: str) -> int:
    change, done, meaning = _CHANGES[action]
    filters = _filters(args)
    batch = _whole(args.batch, "--batch")
    dsn = config_dsn(config)
    if not filters.ids:
        if not args.all and filters == Filters():
            raise ConfigError(
                "arguments",
                f"name the jobs to {action}: ids, filters (--status, --queue, --type, "
                "--older-than, --newer-than, --tag, --payload, --error) or --all",
            )
        matching = guarded(lambda: count_jobs(dsn, filters, action, limits=config.database.limits))
        if matching == 0:
            print(f"no jobs match: nothing to {action}")
            return 0
        if not args.yes:
            print(f"{matching} jobs match; nothing was changed: re-run with --yes to {action} them")
            return 1
    # A bulk change goes up to the newest job that matches when it begins (jobs enqueued later
    # stay).
    result = guarded(lambda: change(dsn, filters, batch=batch, limits=config.database.limits))
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_result(result, done, meaning))
    return 1 if filters.ids and result.skipped else 0


# -- input -----------------------------------------------------------------------------------------


def _filters(args: argparse.Namespace) -> Filters:
    ids = tuple(
        _whole(text, "ids" if i < len(args.ids) else "--id")
        for i, text in enumerate([*args.ids, *args.id_flags])
    )
    return guarded(  # Filters checks the names (as enqueue does): AdminInputError naming the flag
        lambda: Filters(
            statuses=_split(args.status),
            queues=_split(args.queue),
            job_types=_split(args.job_type),
            older_than_s=_age(args.older_than, "--older-than"),
            newer_than_s=_age(args.newer_than, "--newer-than"),
            ids=ids,
            halted=args.halted,
            tags=_split(args.tag),
            payload=None if args.payload is None else payload_filter(args.payload),
            error=args.error,
        )
    )


def _split(values: list[str]) -> tuple[str, ...]:
    return tuple(
        dict.fromkeys(v.strip() for value in values for v in value.split(",") if v.strip())
    )


def _age(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise ConfigError(flag, str(exc)) from None


def _whole(text: str, flag: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(flag, f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise ConfigError(flag, f"must be >= 1, got {value}")
    return value


def config_dsn(config: Any) -> str:
    """The one-shot commands' DSN, or the ConfigError that says how to give one."""
    if not config.dsn:
        raise ConfigError("DISPATCHER_DSN", "is not set (or pass --dsn)")
    return str(config.dsn)


def guarded(work: Callable[[], _T], flags: dict[str, str] | None = None) -> _T:
    """The admin API's own input errors -> ConfigError naming the flag (`flags`: option -> flag;
    the jobs commands' by default), exit 2."""
    try:
        return work()
    except AdminInputError as exc:
        raise ConfigError((flags or _FLAGS).get(exc.option, exc.option), str(exc)) from None


# -- output ----------------------------------------------------------------------------------------


def error_line(error: str | None) -> str:
    """The last line of a traceback (the exception), shortened for a table."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def render_list(rows: list[JobRow]) -> str:
    if not rows:
        return "(no jobs match)"
    # The tags column only where a job listed has tags: a fleet that tags nothing sees no change.
    tagged = any(r.tags for r in rows)
    lines = [
        f"{'id':>10}  {'queue':<14} {'type':<20} {'status':<10} {'attempt':>8}  "
        f"{'since':>7}  " + (f"{'tags':<24} " if tagged else "") + "last error"
    ]
    for r in rows:
        status = r.status + ("*" if r.cancel_requested_at and r.status == "running" else "")
        # -: not given at enqueue, the handler's
        allowed = "-" if r.max_attempts is None else r.max_attempts
        tags = f"{tags_text(r.tags, _TAGS_CHARS):<24} " if tagged else ""
        lines.append(
            f"{r.id:>10}  {r.queue[:14]:<14} {r.job_type[:20]:<20} {status:<10} "
            f"{f'{r.attempts}/{allowed}':>8}  {age_text(r.age_s):>7}  {tags}"
            f"{error_line(r.last_error)}"
        )
    if any(r.cancel_requested_at and r.status == "running" for r in rows):
        lines.append("* cancel requested: its worker cancels it at its next heartbeat")
    return "\n".join(lines)


def tags_text(tags: list[str] | None, most: int | None = None) -> str:
    """A job's tags, comma-separated as `--tag` takes them (-: none), cut at `most` characters."""
    text = ",".join(tags) if tags else "-"
    return text if most is None or len(text) <= most else text[: most - 1] + "…"


def render_halted(keys: list[HaltedKey]) -> str:
    if not keys:
        return "(no halted ordering keys)"
    lines = [
        f"{'queue':<14} {'ordering key':<20} {'job':>10}  {'type':<20} {'status':<10} "
        f"{'failed at':<19} {'waiting':>8}  last error"
    ]
    for k in keys:
        failed_at = f"{k.failed_at:%Y-%m-%d %H:%M:%S}" if k.failed_at else "-"
        lines.append(
            f"{k.queue[:14]:<14} {k.ordering_key[:20]:<20} {k.job_id:>10}  {k.job_type[:20]:<20} "
            f"{k.status:<10} {failed_at:<19} {k.waiting:>8}  {error_line(k.last_error)}"
        )
    lines.append(
        "each key's later jobs wait until its job is retried (`jobs retry ID`), cancelled or purged"
    )
    return "\n".join(lines)


def render_show(detail: JobDetail) -> str:
    job = {name: value for name, value in detail.job.items() if name not in _REPORTED}
    lines = [f"job {job['id']} ({job['status']})"]
    if job.get("ordering_key") is not None:
        lines.append(
            f"  ordering key {job['ordering_key']!r}: "
            + (
                "HALTED by this job: the key's later jobs wait until it is retried, cancelled or "
                "purged"
                if job.get("ordering_halted")
                else "this job does not halt it"
            )
        )
    lines += [
        f"  {name:<20} {'' if value is None else value}"
        for name, value in job.items()
        if name not in ("id", "status", "last_error", "payload", "max_attempts", "errors", "tags")
    ]
    if "tags" in job:
        lines.append(f"  {'tags':<20} {tags_text(job['tags'])}")
    if job.get("max_attempts") is None:
        lines.append(
            f"  {'max_attempts':<20} not given at enqueue: its handler's max_attempts (else 20)"
        )
    else:
        lines.append(f"  {'max_attempts':<20} {job['max_attempts']}")
    lines.append(f"  {'payload':<20} {orjson.dumps(job['payload']).decode()}")
    lines += [
        f"  {name:<20} {orjson.dumps(detail.job[name]).decode()}"
        for name in _REPORTED
        if detail.job.get(name) is not None
    ]
    lines.append("last error:" if detail.last_error else "last error: none")
    lines += [f"  {line}" for line in (detail.last_error or "").splitlines()]
    errors = job.get("errors") or []
    if errors:
        lines.append(f"errors of its failed attempts ({len(errors)}, oldest first):")
        lines += [f"  #{e['attempt']:<3} {e['at']}  {error_line(e['error'])}" for e in errors]
    if not detail.attempts:
        lines.append("attempts: none recorded (the history is kept with DISPATCHER_HISTORY=true)")
    else:
        lines.append(render_attempts(detail.attempts, "attempts"))
    return "\n".join(lines)


def render_attempts(attempts: list[Attempt], title: str) -> str:
    lines = [f"{title} ({len(attempts)}):"]
    for a in attempts:
        lines.append(
            f"  #{a.attempt:<3} {a.outcome:<10} {a.duration_ms:>10.1f} ms  "
            f"{a.started_at:%Y-%m-%d %H:%M:%S}  {a.worker}  {error_line(a.error)}"
        )
    return "\n".join(lines)


def render_result(result: AdminResult, done: str, meaning: str) -> str:
    lines = [
        f"{done} {result.changed_count} of {result.matched} jobs ({meaning})"
        + (f": {_ids(result.changed)}" if result.changed else "")
    ]
    if result.requested_count:
        lines.append(
            f"cancel requested for {result.requested_count} running jobs (cancelled at their "
            f"owner's next heartbeat): {_ids(result.requested)}"
        )
    if result.skipped:
        lines.append(f"skipped {len(result.skipped)}:")
        lines += [f"  {s.id}: {s.reason}" for s in result.skipped[:50]]
        if len(result.skipped) > 50:
            lines.append(f"  ... and {len(result.skipped) - 50} more (--json lists them all)")
    return "\n".join(lines)


def _ids(ids: list[int], most: int = 20) -> str:
    shown = ", ".join(map(str, ids[:most]))
    return shown + (f", ... ({len(ids) - most} more)" if len(ids) > most else "")
