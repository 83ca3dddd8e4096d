"""OpenTelemetry, when installed (the `otel` extra): the trace of the code that enqueued a job goes
on in its handler. `carrier()` is the active span's W3C context, stored with the job at enqueue;
`traced()` wraps a handler so each run is a CONSUMER span continuing it, with the job's attributes.
Without OpenTelemetry both are no-ops (the handler is not wrapped). docs/operations/tracing.md.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from dispatcher.errors import Snooze

try:
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed: tracing is off
    propagate = trace = None  # type: ignore[assignment]  # None: the modules are absent

INSTRUMENTATION = "bucket-dispatcher"
SYSTEM = "bucket-dispatcher"  # messaging.system
PROVIDER_CHECK_S = 1.0
_provider_set = False
_next_check = 0.0


def enabled() -> bool:
    return trace is not None


def carrier() -> dict[str, str] | None:
    """The active span's trace context to store with a job; None outside a valid span."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    return found or None


def attributes(job: Any) -> dict[str, Any]:
    """The job's span attributes: OpenTelemetry's messaging conventions, then ours."""
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "dispatcher.job.type": job.job_type,
        "dispatcher.job.attempt": job.attempts,
        "dispatcher.job.bucket": job.bucket,
    }


def _recording() -> bool:
    """Whether the app set a tracer provider (the SDK's): the API's own ones make spans that
    record nothing, at a cost per job. Asked again at most once a second while not (an app may
    set its provider after its handlers are registered; asking costs ~2 us, too much per job);
    once set, the global provider never changes (the API refuses it)."""
    global _provider_set, _next_check
    if _provider_set:
        return True
    now = time.monotonic()
    if now < _next_check:
        return False
    _next_check = now + PROVIDER_CHECK_S
    _provider_set = not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )
    return _provider_set


def _start(job: Any) -> Any:
    """The handler's span for `job`, as a context manager that makes it current."""
    stored = getattr(job, "trace_context", None)
    parent = propagate.extract(stored) if stored else None
    enqueued = trace.get_current_span(parent).get_span_context() if parent is not None else None
    links = [trace.Link(enqueued)] if enqueued is not None and enqueued.is_valid else None
    return trace.get_tracer(INSTRUMENTATION).start_as_current_span(
        f"{job.job_type} process",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes(job),
        record_exception=False,
        set_status_on_exception=False,
    )


@contextlib.contextmanager
def _span(job: Any) -> Iterator[None]:
    """The job's span, current while its handler runs, and how the run ended: a Snooze is no
    failure; a timeout or a cancel is (CancelledError, which the API would not record: it records
    Exception only)."""
    with _start(job) as span:
        try:
            yield
        except Snooze:
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def traced(fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    """`fn`, run inside its job's span; `fn` itself without OpenTelemetry."""
    if trace is None:
        return fn
    if is_async:

        async def in_span(job: Any) -> Any:
            with _span(job):
                return await fn(job)

        # A plain function that returns the coroutine to await: with no span to make, the
        # handler's own (one coroutine per job, not two).
        @functools.wraps(fn)
        def run_async(job: Any) -> Any:
            return in_span(job) if _recording() else fn(job)

        return run_async

    @functools.wraps(fn)
    def run(job: Any) -> Any:
        if not _recording():
            return fn(job)
        with _span(job):
            return fn(job)

    return run
