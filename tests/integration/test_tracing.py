"""OpenTelemetry (the `otel` extra): a job enqueued inside a span stores that span's trace
context, and its handler runs, in a real `dispatcher run` process, in a CONSUMER span that
continues the trace (its parent, and a link to it) with the job's attributes; a failure and a
timeout end it in error, a snooze does not. Without
OpenTelemetry, nothing is stored and handlers are not wrapped."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
from opentelemetry.sdk.trace import TracerProvider

from dispatcher import JobSpec, enqueue_many_sync, enqueue_sync
from dispatcher.devtools import harness
from tests.helpers import ROOT, fetchall, status_counts, stop_workers, wait_until


def test_the_trace_of_an_enqueue_goes_on_in_its_handler(dsn, tmp_path):
    tracer = TracerProvider().get_tracer("the web app")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with tracer.start_as_current_span("POST /signup") as request:
            ids = [
                enqueue_sync(conn, "traced_ok", {"n": 1}),
                enqueue_sync(conn, "traced_sync", queue="mail"),
                enqueue_sync(conn, "traced_fail", max_attempts=1),
                enqueue_sync(conn, "traced_snooze"),
                enqueue_sync(conn, "traced_slow", max_attempts=1),
            ]
            assert enqueue_many_sync(conn, [JobSpec("traced_ok"), JobSpec("traced_ok")]) == 2
            # Through the staging table: a dedupe key, and an ordering key.
            assert (
                enqueue_many_sync(
                    conn,
                    [
                        JobSpec("traced_ok", dedupe_key="d1"),
                        JobSpec("traced_ok", ordering_key="k1"),
                    ],
                )
                == 2
            )
        outside = enqueue_sync(conn, "traced_ok")
    here = request.get_span_context()
    trace_id, span_id = format(here.trace_id, "032x"), format(here.span_id, "016x")
    stored = dict(fetchall(dsn, "SELECT id, trace_context FROM dispatcher_jobs"))
    assert stored[outside] is None, "no span, nothing stored"
    in_span = [i for i in stored if i != outside]
    assert len(in_span) == 9
    for job_id in in_span:
        assert stored[job_id]["traceparent"].startswith(f"00-{trace_id}-{span_id}-"), stored[job_id]

    spans_file = tmp_path / "spans.jsonl"
    worker = harness.start_worker(
        dsn,
        "tests.apps.traced:registry",
        log=tmp_path / "w.out",
        cwd=ROOT,
        extra_env={"PYTHONPATH": str(ROOT), "TRACE_FILE": str(spans_file)},
        queues="default,mail",
    )
    try:
        wait_until(
            lambda: status_counts(dsn) == {"completed": 8, "failed": 2}, 60, "the ten jobs done"
        )
    finally:
        assert stop_workers([worker]) == [0]
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    consumer = [s for s in spans if s["kind"] == "CONSUMER"]
    snoozed = [s for s in consumer if s["attributes"]["messaging.message.id"] == str(ids[3])]
    assert len(snoozed) == 2 and [s["status"] for s in snoozed] == ["UNSET", "UNSET"], (
        "a snooze is no failure"
    )
    assert all("exception" not in s["events"] for s in snoozed)
    by_job = {int(s["attributes"]["messaging.message.id"]): s for s in consumer}
    assert set(by_job) == set(stored)
    for job_id in in_span:
        span = by_job[job_id]
        assert (span["trace_id"], span["parent"], span["links"]) == (
            trace_id,
            span_id,
            [span_id],
        ), span
    ok = by_job[ids[0]]
    assert ok["name"] == "traced_ok process" and ok["attributes"] == {
        "messaging.system": "bucket-dispatcher",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(ids[0]),
        "dispatcher.job.type": "traced_ok",
        "dispatcher.job.attempt": 1,
        "dispatcher.job.bucket": ok["attributes"]["dispatcher.job.bucket"],
    }
    assert by_job[ids[1]]["attributes"]["messaging.destination.name"] == "mail"
    # The handler's own spans are children of its job's span, async and sync alike.
    inner = {(s["name"], s["parent"]) for s in spans if s["kind"] == "INTERNAL"}
    assert ("send email", ok["span_id"]) in inner and (
        "resize image",
        by_job[ids[1]]["span_id"],
    ) in inner
    failed = by_job[ids[2]]
    assert failed["status"] == "ERROR" and "exception" in failed["events"]
    # cancelled at its timeout: CancelledError, which OpenTelemetry leaves unrecorded
    timed_out = by_job[ids[4]]
    assert timed_out["status"] == "ERROR" and "exception" in timed_out["events"], timed_out
    # A job enqueued outside any span starts a trace of its own, linked to nothing.
    assert by_job[outside]["trace_id"] != trace_id and by_job[outside]["links"] == []
    assert by_job[outside]["parent"] is None


def test_without_opentelemetry_nothing_is_stored_and_handlers_are_not_wrapped(dsn):
    """In a fresh interpreter where `import opentelemetry` fails, as without the extra."""
    script = f"""
import sys
sys.modules["opentelemetry"] = None  # the extra is not installed
import psycopg
from dispatcher import JobSpec, Registry, enqueue_many_sync, enqueue_sync
from dispatcher.api.enqueue_copy import copy_plan
from dispatcher.db.queries import query
from dispatcher.observe import tracing

assert not tracing.enabled() and tracing.carrier() is None
registry = Registry()
def handler(job): pass
registry.handler("plain")(handler)
assert registry.get("plain").run is handler, "not wrapped: the worker calls the handler itself"
from dispatcher.api.enqueue_copy import CopyTally
assert copy_plan(False, CopyTally()) == (query("jobs_copy_in"), None)
with psycopg.connect({dsn!r}, autocommit=True) as conn:
    enqueue_sync(conn, "plain")
    enqueue_many_sync(conn, [JobSpec("plain")])
    enqueue_many_sync(conn, [JobSpec("plain", dedupe_key="d")])
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert fetchall(dsn, "SELECT trace_context FROM dispatcher_jobs") == [(None,)] * 3
