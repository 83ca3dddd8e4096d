-- Tracing (docs/operations/tracing.md): the W3C trace context of the span that enqueued a job
-- ({"traceparent": ..., "tracestate": ...}), so that its handler's span continues that trace. NULL
-- for a job enqueued outside a span, or without OpenTelemetry installed: the column costs those
-- jobs nothing (a NULL is a bit in the row's null bitmap).
--
-- One transaction: a nullable column without a default is a catalog change, milliseconds of
-- ACCESS EXCLUSIVE and no row rewritten, bounded by lock_timeout as in 0007.
SET LOCAL lock_timeout = '5s';

ALTER TABLE dispatcher_jobs ADD COLUMN IF NOT EXISTS trace_context jsonb;
