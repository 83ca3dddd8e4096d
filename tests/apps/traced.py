"""A worker app with OpenTelemetry's SDK configured, as an app that exports traces does: every
finished span is written as one JSON line to $TRACE_FILE (tests/integration/test_tracing.py).

- `traced_ok` (async): opens a span of its own inside the handler's;
- `traced_sync`: a plain function;
- `traced_fail`: raises (enqueue it with max_attempts=1);
- `traced_snooze`: snoozes its first run (no failure), completes the next;
- `traced_slow` (async): outlives its 0.5 s timeout, so it is cancelled (max_attempts=1).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from dispatcher import Job, Registry, Snooze


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                out.write(
                    json.dumps(
                        {
                            "name": span.name,
                            "kind": span.kind.name,
                            "trace_id": format(span.context.trace_id, "032x"),
                            "span_id": format(span.context.span_id, "016x"),
                            "parent": format(span.parent.span_id, "016x") if span.parent else None,
                            "links": [format(link.context.span_id, "016x") for link in span.links],
                            "attributes": dict(span.attributes or {}),
                            "status": span.status.status_code.name,
                            "events": [event.name for event in span.events],
                        }
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["TRACE_FILE"])))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("tests.apps.traced")
registry = Registry()


@registry.handler("traced_ok")
async def traced_ok(job: Job) -> None:
    with tracer.start_as_current_span("send email"):
        pass


@registry.handler("traced_sync")
def traced_sync(job: Job) -> None:
    with tracer.start_as_current_span("resize image"):
        pass


@registry.handler("traced_fail")
def traced_fail(job: Job) -> None:
    raise RuntimeError("boom")


snoozed: set[int] = set()


@registry.handler("traced_snooze")
def traced_snooze(job: Job) -> None:
    if job.id not in snoozed:
        snoozed.add(job.id)
        raise Snooze(0, "not yet")


@registry.handler("traced_slow", timeout_s=0.5)
async def traced_slow(job: Job) -> None:
    await asyncio.sleep(60)
