"""The one-job INSERT (`dispatcher.enqueue`, the store's `jobs_enqueue`, a uniqueness window's
insert): its statement and parameters, the payload sent as the bytes enqueue serialised, and the
trace context of the span that enqueues, when OpenTelemetry has one."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db.listener import format_payload
from dispatcher.db.literals import tag_array
from dispatcher.db.port import NewJob
from dispatcher.db.queries import query
from dispatcher.observe import tracing


def raw_json(data: Any) -> bytes:
    """Jsonb's dumps for a payload serialised already (orjson bytes): sent as is."""
    return data  # type: ignore[no-any-return]  # already orjson bytes


def insert_one_params(job: NewJob) -> dict[str, Any]:
    """jobs_insert_one's parameters: dispatcher.enqueue's and the port's jobs_enqueue."""
    return {
        "queue": job.queue,
        "job_type": job.job_type,
        "payload": Jsonb(job.payload, dumps=raw_json),
        "priority": job.priority,
        "bucket": job.bucket,
        "max_attempts": job.max_attempts,
        "run_at": job.run_at,
        "delay_s": job.delay_s,
        "dedupe_key": job.dedupe_key,
        "ordering_key": job.ordering_key,
        "dedupe_window_s": getattr(job, "dedupe_window_s", None),
        "tags": tag_array(getattr(job, "tags", None)),
        "channel": NOTIFY_CHANNEL,
        "notify": format_payload(job.queue, job.bucket),
        "trace_context": trace_json(),
    }


def trace_json() -> Jsonb | None:
    """The trace context of the span enqueuing now, if OpenTelemetry has one
    (observe/tracing.py)."""
    found = tracing.carrier()
    return None if found is None else Jsonb(found)


def insert_one_sql(job: NewJob) -> str:
    """jobs_insert_one, or its keyed form for a job with an ordering key (sql/ordering.sql)."""
    return query("jobs_insert_one" if job.ordering_key is None else "jobs_insert_one_keyed")
