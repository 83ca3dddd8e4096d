"""Log lines of the `dispatcher` commands: text or JSON on stderr, the worker id on each, no
password.

`configure()` puts one handler on the root logger (every logger reaches it) with `WorkerTag`, the
storm filter (ratelimit.py) and a `text` or `json` formatter that scrubs every password it could
quote. The formats: docs/operations/logs.md.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from types import TracebackType
from typing import IO, Any
from urllib.parse import unquote

import orjson

from coordinator.pg.dsn import REDACTED, password_forms, scrub, urlsplit_password
from dispatcher.observe.job_context import JobTag
from dispatcher.observe.ratelimit import SUPPRESSED, SUPPRESSED_S, StormFilter

JSON = "json"
OUR_LOGGERS = ("dispatcher", "coordinator")  # their lines are the worker's own record
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the shape these lines always had

# Every attribute a LogRecord has without `extra=`, plus those formatters add; the rest of a
# record's attributes are the call's structured fields (names starting with "_" stay private).
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "worker",
}


class WorkerTag(logging.Filter):
    """Puts the process's worker id on every record that has none (a handler filter: it sees
    the records of every logger, not only those of loggers it is attached to)."""

    def __init__(self, worker: str | None = None) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "worker", None) is None:
            record.worker = self.worker
        return True


class Redactor:
    """Blanks passwords in a formatted line: any URI user info or key-value (dsn.scrub), and each
    spelling of the passwords of the DSNs and URLs given to `protect` (computed once, there)."""

    def __init__(self) -> None:
        self._forms: tuple[str, ...] = ()

    def protect(self, *secrets: str | None, tokens: tuple[str | None, ...] = ()) -> None:
        """Also blank the passwords of these DSNs (PostgreSQL) or URLs (Redis), in every spelling,
        and these `tokens` as they are."""
        forms = set(self._forms) | {t for t in tokens if t}
        for secret in secrets:
            if not secret:
                continue
            forms.update(password_forms(secret))
            password = urlsplit_password(secret)  # a Redis URL's
            if password:
                forms.update((password, unquote(password)))
        forms.discard("")
        # longest first: a longer form blanked whole
        self._forms = tuple(sorted(forms, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        text = scrub(text)
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return text


def fields(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    """The record's structured fields: what the call passed in `extra=` (and `suppressed`)."""
    for key, value in record.__dict__.items():
        if key not in _RESERVED and key[0] != "_":
            yield key, value


def message(record: logging.LogRecord) -> str:
    """The formatted message, and the storm filter's count when it carries one."""
    text = record.getMessage()
    suppressed_s = getattr(record, SUPPRESSED_S, None)
    if suppressed_s is not None:
        text += (
            f" ({getattr(record, SUPPRESSED)} similar lines suppressed in the last "
            f"{suppressed_s:.3g} s)"
        )
    return text


def iso_utc(record: logging.LogRecord) -> str:
    """ISO-8601 UTC with milliseconds: 2025-01-31T09:14:03.512Z."""
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        return (
            value
            if value and not any(c.isspace() or c in '"=' for c in value)
            else orjson.dumps(value).decode()
        )
    if isinstance(value, datetime):
        return value.isoformat()
    return orjson.dumps(value, default=str).decode()


class TextFormatter(logging.Formatter):
    """`2025-01-31 10:14:03,512 WARNING dispatcher.runtime.joblog: job 42 failed ... worker=pod-a
    job_id=42 ...`, a traceback on the lines after it; redacted as a whole."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__(TEXT_FORMAT)
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        record.message = message(record)
        record.asctime = self.formatTime(record, self.datefmt)
        parts = [self.formatMessage(record)]
        worker = getattr(record, "worker", None)
        if worker is not None:
            parts.append(f"worker={_text_value(worker)}")
        parts += [f"{key}={_text_value(value)}" for key, value in fields(record)]
        line = " ".join(parts)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return self._redact(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, worker, the structured fields, and
    `exception` / `stack` when present. Each string is redacted before it is encoded (after,
    JSON's escapes could hide a password from the patterns, or a pattern eat a closing quote)."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        redact = self._redact
        doc: dict[str, Any] = {
            "ts": iso_utc(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": redact(message(record)),
            "worker": getattr(record, "worker", None),
        }
        for key, value in fields(record):
            if key not in doc:
                doc[key] = redact(value) if isinstance(value, str) else value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = redact(record.exc_text)
        if record.stack_info:
            doc["stack"] = redact(self.formatStack(record.stack_info))
        # default=str: a field orjson cannot encode (a set, an exception) becomes its text,
        # redacted.
        return orjson.dumps(
            doc, default=lambda v: redact(str(v)), option=orjson.OPT_NON_STR_KEYS
        ).decode()


class LogHandler(logging.StreamHandler):  # type: ignore[type-arg]  # generic in typeshed only
    """The one handler: worker tag, storm filter, formatter. On close (logging's shutdown at
    exit) it writes the suppressed counts not yet reported."""

    def __init__(self, stream: IO[str], formatter: logging.Formatter, tag: WorkerTag) -> None:
        super().__init__(stream)
        self.storm = StormFilter(emit=self.handle)
        self.addFilter(tag)  # first: a summary line of the storm filter gets the worker id too
        self.addFilter(JobTag())  # job_id, job_type, queue, attempt on a line a handler logs
        self.addFilter(self.storm)
        self.setFormatter(formatter)

    def close(self) -> None:
        for summary in self.storm.drain():
            self.handle(summary)
        super().close()


_tag = WorkerTag()
_redactor = Redactor()
_formatter: logging.Formatter = TextFormatter(_redactor)
_json = False
_handler: LogHandler | None = None
_level = logging.INFO


def configure(
    log_format: str | None,
    level: str | None,
    *,
    worker: str | None = None,
    stream: IO[str] | None = None,
) -> LogHandler:
    """Send every logger's lines to `stream` (stderr) in `log_format` (text unless 'json'), at
    `level` (INFO unless a valid level name). Lenient: it runs before the settings are
    validated (Config then refuses a bad value, naming it, in the format chosen here)."""
    global _formatter, _json, _handler, _level
    _json = (log_format or "").strip().lower() == JSON
    _formatter = JsonFormatter(_redactor) if _json else TextFormatter(_redactor)
    _tag.worker = worker
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, LogHandler)]:
        root.removeHandler(old)
        old.close()
    handler = LogHandler(stream or sys.stderr, _formatter, _tag)
    root.addHandler(handler)
    _handler, _level = handler, getattr(logging, (level or "INFO").strip().upper(), logging.INFO)
    root.setLevel(_level)
    for name in OUR_LOGGERS:  # their own level: an app that raises the root's keeps them at ours
        logging.getLogger(name).setLevel(_level)
    logging.captureWarnings(True)  # warnings.warn lines get the worker id and the format too
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread
    return handler


def _report_suppressed() -> None:
    """At exit, the storm filter's last counts: logging's own shutdown closes (and so reports)
    only the handlers it still knows, and an app's dictConfig makes it forget ours."""
    if _handler is not None:
        for summary in _handler.storm.drain():
            _handler.handle(summary)


atexit.register(_report_suppressed)  # after logging's own registration, so it runs before it


def reinstall() -> None:
    """After the app's import (`dispatcher run`): undo what its logging configuration did to the
    dispatcher's lines (a `logging.config.dictConfig` that disables existing loggers, resets
    their levels or replaces the root logger's handlers, as Django's LOGGING may), and say once
    what that was. The app's own handlers stay where it put them."""
    if _handler is None:
        return  # never configured (dispatcher used as a library): nothing of ours to restore
    root = logging.getLogger()
    found = []
    disabled = sorted(
        name
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
        and logger.disabled
        and name.split(".")[0] in OUR_LOGGERS
    )
    for name in disabled:
        logging.getLogger(name).disabled = False
    if disabled:
        found.append(
            f"disabled {len(disabled)} of the dispatcher's loggers ({', '.join(disabled[:3])}"
            f"{', ...' if len(disabled) > 3 else ''}), enabled again"
        )
    for name in OUR_LOGGERS:
        logging.getLogger(name).setLevel(_level)
    if _handler not in root.handlers:
        root.addHandler(_handler)
        found.append("removed the dispatcher's log handler from the root logger, put back")
    others = [type(h).__name__ for h in root.handlers if h is not _handler]
    if found and others:
        found.append(
            f"the root logger also has the app's {', '.join(others)}: a line may be written twice"
        )
    if found:
        logging.getLogger("dispatcher.observe").warning(
            "the app's logging configuration %s; the dispatcher's lines keep DISPATCHER_LOG_FORMAT",
            "; ".join(found),
            extra={"app_log_handlers": others},
        )


def set_worker(worker_id: str | None) -> None:
    """From now on every line carries this worker id."""
    _tag.worker = worker_id


def protect(*secrets: str | None, tokens: tuple[str | None, ...] = ()) -> None:
    """Blank the passwords of these DSNs / URLs, and these `tokens`, wherever a line quotes them."""
    _redactor.protect(*secrets, tokens=tokens)


def redact(text: str) -> str:
    """`text` with every password and token the log lines hide blanked (for a page that quotes an
    error)."""
    return _redactor(text)


def render(level: int, logger: str, text: str) -> str:
    """One line as the handler would write it, without the logging machinery (no lock: for the
    hard exit, which may run while a stuck thread holds the handler's lock)."""
    record = logging.LogRecord(logger, level, __file__, 0, "%s", (text,), None)
    _tag.filter(record)
    return _formatter.format(record)


def fatal(text: str) -> None:
    """The one line a command that fails writes on stderr: `dispatcher: <text>` (a JSON line
    in the json format), redacted."""
    print(
        render(logging.ERROR, "dispatcher", text) if _json else "dispatcher: " + _redactor(text),
        file=sys.stderr,
    )


def _uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("dispatcher").critical("uncaught %s", kind.__name__, exc_info=(kind, exc, tb))


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("dispatcher").critical(
        "uncaught %s in thread %s",
        args.exc_type.__name__,
        name,
        exc_info=args.exc_value,  # its __traceback__ is the thread's
    )
