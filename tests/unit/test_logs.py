"""The log handler as `dispatcher` commands set it up: formats, the worker id, redaction."""

import io
import logging
import re
import sys
import threading

import orjson
import pytest

from dispatcher.observe import logs
from dispatcher.observe.ratelimit import SUPPRESSED, SUPPRESSED_S

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TEXT_HEAD = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "  # today's asctime


@pytest.fixture
def stream():
    """configure() on a private stream; the process-wide state it changes is restored after."""
    root = logging.getLogger()
    saved = (
        list(root.handlers),
        root.level,
        sys.excepthook,
        threading.excepthook,
        logs._formatter,
        logs._json,
    )
    ours = {name: logging.getLogger(name).level for name in logs.OUR_LOGGERS}
    saved_handler = logs._handler, logs._level
    yield io.StringIO()
    for name, level in ours.items():
        logging.getLogger(name).setLevel(level)
    logs._handler, logs._level = saved_handler
    for handler in [h for h in root.handlers if isinstance(h, logs.LogHandler)]:
        root.removeHandler(handler)
    root.handlers[:], sys.excepthook, threading.excepthook, logs._formatter, logs._json = (
        saved[0],
        *saved[2:],
    )
    root.setLevel(saved[1])  # setLevel, not assignment: it clears the loggers' level caches
    logging.captureWarnings(False)
    logs.set_worker(None)
    logs._redactor._forms = ()


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_json_line_has_the_fields_and_the_structured_extras(stream):
    logs.configure("json", "INFO", worker="pod-a", stream=stream)
    logging.getLogger("dispatcher.jobs").warning(
        "job %d failed (attempt %d/%d)",
        42,
        2,
        5,
        extra={"job_id": 42, "queue": "default", "bucket": 17},
    )
    [line] = lines(stream)
    doc = orjson.loads(line)
    assert TS.fullmatch(doc.pop("ts"))
    assert doc == {
        "level": "WARNING",
        "logger": "dispatcher.jobs",
        "msg": "job 42 failed (attempt 2/5)",
        "worker": "pod-a",
        "job_id": 42,
        "queue": "default",
        "bucket": 17,
    }


def test_text_line_keeps_its_shape_then_the_worker_and_fields(stream):
    logs.configure("text", "INFO", worker="pod-a", stream=stream)
    logging.getLogger("dispatcher.jobs").warning(
        "job %d failed", 42, extra={"job_id": 42, "error": "ValueError: a b", "retry_in_s": 1.5}
    )
    [line] = lines(stream)
    assert re.fullmatch(
        TEXT_HEAD + r"WARNING dispatcher\.jobs: job 42 failed worker=pod-a job_id=42 "
        r'error="ValueError: a b" retry_in_s=1\.5',
        line,
    ), line


def test_every_logger_gets_the_worker_id_also_set_after_configure(stream):
    logs.configure("json", "DEBUG", stream=stream)
    logging.getLogger("psycopg.pool").warning("before the config")
    logs.set_worker("pod-b")
    logging.getLogger("coordinator.coordinator").info("rebalance")
    logging.getLogger("asyncio").debug("third party")
    logging.getLogger("py.warnings").warning("a warning, as captureWarnings logs it")
    docs = [orjson.loads(line) for line in lines(stream)]
    assert [d["worker"] for d in docs] == [None, "pod-b", "pod-b", "pod-b"]


def test_text_without_a_worker_omits_it(stream):
    logs.configure("text", "INFO", stream=stream)
    logging.getLogger("dispatcher.db.migrate").info("applied")
    assert lines(stream)[0].endswith("dispatcher.db.migrate: applied")


def test_an_exception_is_one_json_line_and_text_lines_after(stream):
    logs.configure("json", "INFO", worker="w", stream=stream)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("it broke")
    [line] = lines(stream)
    doc = orjson.loads(line)
    assert doc["msg"] == "it broke" and doc["exception"].endswith("ValueError: boom")
    assert doc["exception"].startswith("Traceback (most recent call last):")


def test_the_storm_count_is_a_field_and_text(stream):
    logs.configure("json", "INFO", worker="w", stream=stream)
    logging.getLogger("x").warning("job %d failed", 1, extra={SUPPRESSED: 7, SUPPRESSED_S: 12.2})
    doc = orjson.loads(lines(stream)[0])
    assert (
        doc["suppressed"] == 7
        and doc["msg"] == "job 1 failed (7 similar lines suppressed in the last 12.2 s)"
    )
    assert SUPPRESSED_S not in doc


def test_a_storm_through_the_real_handler_adds_up(stream):
    handler = logs.configure("json", "INFO", worker="w", stream=stream)
    log = logging.getLogger("dispatcher.jobs")
    for i in range(500):
        log.warning("job %d failed", i, extra={"job_id": i})
    handler.close()  # logging's shutdown: what was dropped is reported
    docs = [orjson.loads(line) for line in lines(stream)]
    shown = [d for d in docs if "job_id" in d]
    assert len(shown) == 10 and len(docs) == 11
    assert len(shown) + sum(d.get("suppressed", 0) for d in docs) == 500
    assert docs[-1]["worker"] == "w" and "the last one: job 499 failed" in docs[-1]["msg"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_password_in_message_fields_or_traceback(stream, fmt):
    logs.configure(fmt, "INFO", worker="w", stream=stream)
    logs.protect("postgresql://app:Pq%25word1@db/jobs", "redis://:Rd-pass2@cache:6379/0", None)
    log = logging.getLogger("x")
    log.warning("cannot connect to postgresql://u:Uri-pw3@h:5432/db and redis://:Rd-pass4@h/0")
    log.warning(
        'libpq said: invalid percent-encoded token: "Pq%word1"; or host=h password=Kv-pw5 user=u'
    )
    log.warning(
        "quoted password='Kv pw6' and {'password': 'Dict-pw7'} and pwd=%s",
        "Pw-8",
        extra={"dsn": "postgresql://x:Extra-pw9@h/db", "detail": "Rd-pass2"},
    )
    try:
        raise RuntimeError("connect(password=Exc-pw10)")
    except RuntimeError:
        log.exception("failed with Pq%25word1")
    text = stream.getvalue()
    for secret in (
        "Pq%word1",
        "Pq%25word1",
        "Rd-pass2",
        "Uri-pw3",
        "Rd-pass4",
        "Kv-pw5",
        "Kv pw6",
        "Dict-pw7",
        "Pw-8",
        "Extra-pw9",
        "Exc-pw10",
    ):
        assert secret not in text, (secret, text)
    assert "postgresql://u:***@h:5432/db" in text and "redis://:***@h/0" in text
    if fmt == "json":
        # redacted before encoding: still JSON
        assert all(orjson.loads(line) for line in lines(stream))


def test_fatal_is_todays_line_in_text_and_a_json_line_in_json(stream, capsys):
    logs.configure("text", "INFO", stream=stream)
    logs.fatal("invalid setting DISPATCHER_LEASE_S: must be >= 1 (postgresql://u:pw@h/db)")
    assert (
        capsys.readouterr().err == "dispatcher: invalid setting DISPATCHER_LEASE_S: must be >= 1 "
        "(postgresql://u:***@h/db)\n"
    )
    logs.configure("json", "INFO", worker="pod-a", stream=stream)
    logs.fatal("cannot connect")
    doc = orjson.loads(capsys.readouterr().err)
    assert (doc["level"], doc["logger"], doc["msg"], doc["worker"]) == (
        "ERROR",
        "dispatcher",
        "cannot connect",
        "pod-a",
    )


def test_render_needs_no_handler_lock(stream):
    handler = logs.configure("json", "INFO", worker="w", stream=stream)
    with handler.lock:  # as a stuck thread might hold it: the hard exit's line is still made
        done = []
        t = threading.Thread(
            target=lambda: done.append(logs.render(logging.ERROR, "dispatcher", "exiting"))
        )
        t.start()
        t.join(5)
    assert orjson.loads(done[0])["msg"] == "exiting"


def test_bad_values_fall_back_until_the_config_refuses_them(stream):
    logs.configure("xml", "LOUD", stream=stream)
    logging.getLogger("x").info("still logged")
    assert re.fullmatch(TEXT_HEAD + "INFO x: still logged", lines(stream)[0])


def test_uncaught_exceptions_become_lines_too(stream):
    logs.configure("json", "INFO", worker="w", stream=stream)
    try:
        raise RuntimeError("bug at postgresql://u:pw@h/db")
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    thread = threading.Thread(target=lambda: 1 / 0, name="sync-1")
    thread.start()
    thread.join()
    main, in_thread = (orjson.loads(line) for line in lines(stream))
    assert (main["level"], main["msg"], main["worker"]) == (
        "CRITICAL",
        "uncaught RuntimeError",
        "w",
    )
    assert main["exception"].endswith("RuntimeError: bug at postgresql://u:***@h/db")
    assert in_thread["msg"] == "uncaught ZeroDivisionError in thread sync-1"


class _Job:
    id, job_type, queue, attempts = 7, "send", "mail", 2


def test_a_line_logged_inside_a_handler_carries_its_job_in_both_formats(stream):
    import asyncio

    from dispatcher.observe.job_context import CURRENT_JOB, run_in_job

    logs.configure("text", "INFO", worker="w", stream=stream)
    run_in_job(lambda job: logging.getLogger("app").warning("sync line"), _Job())
    logging.getLogger("app").warning("outside")

    async def handler() -> None:
        CURRENT_JOB.set(_Job())  # as the executor does, in the handler's own task
        logging.getLogger("app").warning("async line")

    asyncio.run(handler())
    logging.getLogger("app").warning("after")
    sync_line, outside, async_line, after = lines(stream)
    for line in (sync_line, async_line):
        assert line.endswith("worker=w job_id=7 job_type=send queue=mail attempt=2"), line
    assert "job_id" not in outside and "job_id" not in after, (
        "nothing leaks out of the handler's context"
    )

    stream.truncate(0), stream.seek(0)
    logs.configure("json", "INFO", worker="w", stream=stream)
    run_in_job(lambda job: logging.getLogger("app").info("json line", extra={"job_id": 99}), _Job())
    doc = orjson.loads(lines(stream)[0])
    assert (doc["job_id"], doc.get("job_type")) == (99, None), "a field the call gives itself wins"


def test_reinstall_undoes_an_apps_dictconfig_and_says_what_it_did(stream):
    import logging.config

    logs.configure("json", "INFO", worker="w", stream=stream)
    logging.getLogger("dispatcher.serve.lifecycle")  # exists before the app's configuration
    app_out = io.StringIO()
    try:
        logging.config.dictConfig(
            {
                "version": 1,
                "disable_existing_loggers": True,
                "handlers": {"app": {"class": "logging.StreamHandler", "stream": app_out}},
                "root": {"handlers": ["app"], "level": "WARNING"},
            }
        )
        logging.getLogger("dispatcher.serve.lifecycle").info("silenced")
        assert lines(stream) == [], "what an app's dictConfig does without reinstall"
        logs.reinstall()
        logging.getLogger("dispatcher.serve.lifecycle").info("received SIGTERM")
        warning, line = (orjson.loads(text) for text in lines(stream))
        assert warning["logger"] == "dispatcher.observe" and "disabled" in warning["msg"]
        assert "put back" in warning["msg"] and warning["app_log_handlers"] == ["StreamHandler"]
        assert line["msg"] == "received SIGTERM"
        stream.truncate(0), stream.seek(0)
        logs.reinstall()
        assert lines(stream) == [], "said once: nothing left to undo"
    finally:
        for logger in logging.Logger.manager.loggerDict.values():
            if isinstance(logger, logging.Logger):
                logger.disabled = False


def test_lines_suppressed_after_an_apps_dictconfig_are_still_counted_at_exit():
    """dictConfig closes every handler logging knows and forgets them: logging's shutdown at exit
    would then not report what the storm filter dropped since."""
    import subprocess

    script = "\n".join(
        [
            "import logging, logging.config",
            "from dispatcher.observe import logs",
            "logs.configure('json', 'INFO', worker='w')",
            "logging.config.dictConfig({'version': 1, 'disable_existing_loggers': True})",
            "logs.reinstall()",
            "for i in range(50):",
            "    logging.getLogger('dispatcher.jobs').warning('job %d failed', i)",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    docs = [orjson.loads(line) for line in done.stderr.splitlines()]
    jobs = [d for d in docs if d["logger"] == "dispatcher.jobs"]
    shown = [d for d in jobs if "suppressed" not in d]
    assert 0 < len(shown) < 50 and len(shown) + sum(d.get("suppressed", 0) for d in jobs) == 50, (
        jobs[-2:]
    )
