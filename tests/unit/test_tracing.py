"""dispatcher/observe/tracing.py without a database: the carrier of the active span, the handler
wrapper that makes no span while the app has set no tracer provider (the API's no-op one), and the
job's attributes (a real worker's spans: tests/integration/test_tracing.py)."""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from dispatcher.observe import tracing


class _Job:
    id, job_type, queue, attempts, bucket, trace_context = 7, "send", "mail", 2, 40, None


def test_the_carrier_is_the_active_spans_context_and_none_outside_one():
    assert tracing.enabled() and tracing.carrier() is None
    with TracerProvider().get_tracer("t").start_as_current_span("request") as span:
        found = tracing.carrier()
    ids = span.get_span_context()
    assert found is not None and found["traceparent"].startswith(
        f"00-{ids.trace_id:032x}-{ids.span_id:016x}-"
    )


def test_without_a_tracer_provider_a_handler_runs_in_no_span_of_ours():
    seen = []

    def sync(job):
        seen.append(trace.get_current_span().get_span_context().is_valid)
        return "done"

    async def run_async(job):
        seen.append(trace.get_current_span().get_span_context().is_valid)
        return "done"

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), (
        "no test set a global provider"
    )
    assert tracing.traced(sync, False)(_Job()) == "done"
    assert asyncio.run(tracing.traced(run_async, True)(_Job())) == "done"
    assert seen == [False, False]


def test_the_spans_attributes_follow_the_messaging_conventions():
    assert tracing.attributes(_Job()) == {
        "messaging.system": "bucket-dispatcher",
        "messaging.operation.type": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": "7",
        "dispatcher.job.type": "send",
        "dispatcher.job.attempt": 2,
        "dispatcher.job.bucket": 40,
    }


def test_a_registered_handler_keeps_its_function_and_the_worker_calls_the_wrapped_one():
    from dispatcher import Registry

    async def handler(job):
        return None

    registry = Registry()
    registry.handler("h")(handler)
    got = registry.get("h")
    assert got.fn is handler and got.is_async and got.run is not handler
    # an app that builds a registry from another's handlers (tests/apps/faulty.py)
    again = Registry()
    again.handler("h")(got.fn)
    assert again.get("h").is_async and again.get("h").fn is handler
