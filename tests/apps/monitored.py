"""The faulty app (tests/apps/faulty.py) plus a schedule, for the test that every metric the alert
rules and the dashboard read is exported: the schedule gauges appear once a worker holds its
queue's schedules lease. Its slots are on the 29th of February only (the next: 2028-02-29), so it
never enqueues a job during a test."""

from __future__ import annotations

from tests.apps.faulty import registry

registry.schedule("metrics-probe", "0 0 29 2 *", job_type="record")
