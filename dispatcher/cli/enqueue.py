"""`dispatcher enqueue`: one job, or --count copies of it, from the command line.

Every flag holds for every copy, or is refused: a dedupe key cannot be shared by copies (only the
first would go in), so --count > 1 with --dedupe-key exits 2; a partition key puts all copies in
its bucket. The payload is JSON given inline, `@FILE`, or `-` for standard input (a payload too
big for a command line). Enqueue's own rules judge the rest: a value they refuse exits 2 naming
its flag, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import orjson

from dispatcher.errors import ConfigError, EnqueueError, PayloadError

# a bulk enqueue's COPY may take statement_timeout_s x this (30 s at the defaults)
ENQUEUE_BUDGET = 6.0


def add_enqueue_parser(
    sub: Any,
    add_config_flags: Callable[[argparse.ArgumentParser], None],
    config_from: Callable[[argparse.Namespace], Any],
    require_dsn: Callable[[Any], str],
) -> None:
    """Register `dispatcher enqueue` on the top-level subparsers."""
    p = sub.add_parser("enqueue", help="enqueue one job (or --count copies of it)")
    p.add_argument("job_type", help="the job's type: the name its handler is registered under")
    p.add_argument(
        "--payload",
        default=None,
        help="the job's payload as JSON; @FILE reads it from a file, - from standard input "
        "(default: none, null)",
    )
    p.add_argument(
        "--queue", default="default", help="the queue to put it in (default %(default)s)"
    )
    p.add_argument(
        "--priority", type=int, default=0, help="smaller runs first (default %(default)s)"
    )
    p.add_argument(
        "--delay-s",
        type=float,
        default=0.0,
        help="seconds from now before it may run (default %(default)g)",
    )
    p.add_argument(
        "--jitter-s",
        type=float,
        default=0.0,
        help=(
            "up to this many seconds more, at random, so a burst spreads out (default %(default)g)"
        ),
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        help=(
            "attempts before the job fails for good (default: its handler's max_attempts, else 20)"
        ),
    )
    p.add_argument(
        "--dedupe-key",
        default=None,
        help="a key no other live job of the queue may have: a duplicate is not enqueued "
        "(default: none; not with --count > 1)",
    )
    p.add_argument(
        "--dedupe-window-s",
        type=float,
        default=None,
        help="with --dedupe-key: the key also stays held this many seconds after the job finished "
        "(default: only while it is live)",
    )
    p.add_argument(
        "--partition-key",
        default=None,
        help="jobs with the same key get the same bucket (default: none: the dedupe key's "
        "bucket, else a random one); with --count, every copy",
    )
    p.add_argument(
        "--ordering-key",
        default=None,
        help="jobs of the queue with the same key run one at a time, in the order they were "
        "enqueued (default: none)",
    )
    p.add_argument(
        "--count",
        type=int,
        default=1,
        help="how many copies of the job to enqueue (default %(default)s)",
    )
    add_config_flags(p)
    p.set_defaults(func=lambda args: cmd_enqueue(args, config_from(args), require_dsn))


def cmd_enqueue(args: argparse.Namespace, config: Any, require_dsn: Callable[[Any], str]) -> int:
    from dispatcher.api.enqueue import enqueue_payloads_sync, enqueue_sync, refresh_statistics_sync
    from dispatcher.db.oneshot import bounded_transaction, session

    dsn = require_dsn(config)
    copies = _copies(args)
    payload = read_payload(args.payload)
    options: dict[str, Any] = {
        "queue": args.queue,
        "priority": args.priority,
        "delay_s": args.delay_s,
        "max_attempts": args.max_attempts,
        "jitter_s": args.jitter_s,
        "max_payload_bytes": config.max_payload_bytes,
    }
    # Enqueue's own rules judge the arguments (one copy of each rule); a value they refuse is a
    # bad argument like any other, so it exits 2 naming the flag. Nothing was written. The
    # enqueue runs in a bounded transaction: a locked table ends it after the lock timeout.
    limits = config.database.limits
    try:
        with session(dsn, limits, application_name="dispatcher-enqueue") as conn:
            with bounded_transaction(conn, "enqueue", limits, budget=ENQUEUE_BUDGET):
                if args.count == 1:
                    job_id = enqueue_sync(
                        conn,
                        args.job_type,
                        payload,
                        dedupe_key=args.dedupe_key,
                        dedupe_window_s=args.dedupe_window_s,
                        partition_key=args.partition_key,
                        ordering_key=args.ordering_key,
                        **options,
                    )
                else:
                    n = enqueue_payloads_sync(
                        conn, args.job_type, [payload] * args.count, **copies, **options
                    )
            if args.count > 1:  # ANALYZE waits on locks too: bounded the same way
                with bounded_transaction(conn, "enqueue", limits, budget=ENQUEUE_BUDGET):
                    refresh_statistics_sync(conn, n)
    except PayloadError as exc:
        raise ConfigError("--payload", str(exc)) from None
    except EnqueueError as exc:
        raise ConfigError(_flag_of(exc.option), str(exc)) from None
    print(
        f"enqueued {n} jobs"
        if args.count > 1
        else f"enqueued job {job_id}"
        if job_id is not None
        else "duplicate: a live job has that dedupe key"
        if args.dedupe_window_s is None
        else "duplicate: a job with that dedupe key is live or finished within its window"
    )
    return 0


def _copies(args: argparse.Namespace) -> dict[str, Any]:
    """What --count > 1 copies get of the per-job keys (enqueue_payloads' partition_keys or
    ordering_keys), or the ConfigError of a flag that cannot hold for every copy."""
    if args.count < 1:
        raise ConfigError("--count", f"must be >= 1, got {args.count}")
    if args.count == 1:
        return {}
    if args.dedupe_key is not None:
        raise ConfigError(
            "--dedupe-key",
            f"copies of one job (--count {args.count}) cannot share a dedupe key: only the first "
            "would be enqueued; enqueue them one by one with a key each",
        )
    if args.dedupe_window_s is not None:
        raise ConfigError(
            "--dedupe-window-s", "copies of one job (--count) cannot each hold a dedupe key"
        )
    partition, ordering = args.partition_key, args.ordering_key
    if ordering is not None:
        # An ordering key picks the bucket: a partition key beside it must agree, as for one job.
        from dispatcher.api.enqueue import bucket_for

        if partition is not None and bucket_for(partition) != bucket_for(ordering):
            raise ConfigError(
                "--partition-key",
                f"{partition!r} maps to bucket {bucket_for(partition)} and --ordering-key "
                f"{ordering!r} to bucket {bucket_for(ordering)}: give one of them",
            )
        return {"ordering_keys": [ordering] * args.count}
    if partition is not None:
        return {"partition_keys": [partition] * args.count}
    return {}


def read_payload(text: str | None) -> Any:
    """--payload's JSON: inline, `@FILE`, or `-` (standard input). A payload cannot start with @
    (no JSON value does), so `@` always means a file. ConfigError naming --payload if it cannot
    be read or parsed."""
    if text is None:
        return None
    data: str | bytes = text
    if text == "-":
        data = sys.stdin.buffer.read()
        where = "standard input"
    elif text.startswith("@"):
        path = text[1:]
        if not path:
            raise ConfigError("--payload", "@ needs a file name: --payload @payload.json")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ConfigError("--payload", f"cannot read {path!r}: {exc.strerror}") from None
        where = repr(path)
    else:
        where = ""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        source = f" (from {where})" if where else ""
        reason = " ".join(str(exc).split())
        raise ConfigError("--payload", f"not valid JSON{source}: {reason}") from None


def _flag_of(option: str | None) -> str:
    """enqueue's keyword argument -> the `dispatcher enqueue` argument that sets it."""
    if option is None:
        return "arguments"  # a rule about several options at once
    if option in ("ordering_keys", "partition_keys"):  # --count copies go through enqueue_payloads
        return "--" + option[:-1].replace("_", "-")
    return option if option == "job_type" else "--" + option.replace("_", "-")
