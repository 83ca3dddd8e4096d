"""`workflows`: graphs of jobs on a ready fleet, at the defaults and tuned, in both modes.

Two shapes, each enqueued whole (enqueue_workflow) once the fleet is ready and drained by the demo
app's no-op handler: a fan-out and fan-in (a root, `children` jobs after it, a sink after all of
them) and a chain (`chain` jobs, each after the one before). Read from the jobs' own rows
(database clock): jobs per second from the first start to the last completion, and the delay from
a job's last parent's completion (its completed_at) to the job's start (its locked_at), p50/p99:
for the chain, the step-to-step latency of a workflow; for the fan-out, how long the children
queued behind each other; for the fan-in, the sink's single delay. What the columns mean:
docs/guides/benchmarks.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import psycopg

from bench.core import Result, reset
from bench.fleet import Fleet
from bench.scenarios import percentiles
from dispatcher import Workflow, enqueue_workflow_sync

COLUMNS = [
    "profile",
    "shape",
    "mode",
    "workers",
    "jobs",
    "seconds",
    "jobs_per_s",
    "ready_to_start_p50_ms",
    "ready_to_start_p99_ms",
    "ready_to_start_max_ms",
    "ran_twice",
    "not_completed",
]


def fan_out(children: int) -> Workflow:
    wf = Workflow()
    wf.add("root", "noop")
    names = [wf.add(f"c{n}", "noop", after=["root"]) for n in range(children)]
    wf.add("sink", "noop", after=names)
    return wf


def chain(steps: int) -> Workflow:
    wf = Workflow()
    after: list[str] = []
    for n in range(steps):
        after = [wf.add(f"s{n}", "noop", after=after)]
    return wf


def workflows_suite(
    dsn: str,
    result: Result,
    *,
    workers: int,
    modes: list[str],
    profiles: Iterable[str],
    children: int,
    steps: int,
    timeout_s: float = 600,
) -> None:
    """One run per profile, shape and mode, each on a fleet started for it and ready."""
    for profile in profiles:
        for shape, graph in (("fan-out", fan_out(children)), ("chain", chain(steps))):
            for mode in modes:
                row = _run(dsn, mode, workers, profile, graph, timeout_s)
                delays = row.pop("delays_ms")
                result.add(profile=profile, shape=shape, mode=mode, workers=workers, **row)
                result.rows[-1]["delays_ms"] = delays  # in the JSON, not on the console


def _run(
    dsn: str, mode: str, workers: int, profile: str, graph: Workflow, timeout_s: float
) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
        conn.execute("TRUNCATE dispatcher_job_deps")
        with Fleet(dsn, mode, workers, profile=profile) as fleet:
            fleet.wait_ready()
            ids = enqueue_workflow_sync(conn, graph)
            deadline = time.monotonic() + timeout_s
            last = max(ids.values())
            while _status(conn, last) != "completed":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workflow not done after {timeout_s:g} s")
                fleet.check_alive()
                time.sleep(0.05)
        return _summary(conn, list(ids.values()))


def _status(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    row = conn.execute("SELECT status FROM dispatcher_jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def _summary(conn: psycopg.Connection[Any], ids: list[int]) -> dict[str, Any]:
    """Rate and readiness delays from the rows: each job's start against the completion of the
    last of its parents."""
    (seconds, done, twice), *_ = conn.execute(
        """SELECT extract(epoch FROM max(completed_at) - min(locked_at))::float8,
                  count(*) FILTER (WHERE status = 'completed'),
                  count(*) FILTER (WHERE attempts > 1)
             FROM dispatcher_jobs WHERE id = ANY(%(ids)s)""",
        {"ids": ids},
    ).fetchall()
    delays = sorted(
        float(ms)
        for (ms,) in conn.execute(
            """SELECT 1000 * extract(epoch FROM c.locked_at - max(p.completed_at))::float8
                 FROM dispatcher_jobs AS c
                 JOIN dispatcher_jobs AS p ON p.id = ANY(c.depends_on)
                WHERE c.id = ANY(%(ids)s)
                GROUP BY c.id, c.locked_at""",
            {"ids": ids},
        ).fetchall()
    )
    return {
        "jobs": len(ids),
        "seconds": round(seconds, 3),
        "jobs_per_s": round(len(ids) / seconds) if seconds else None,
        **percentiles("ready_to_start", delays),
        "ran_twice": int(twice),
        "not_completed": len(ids) - int(done),
        "delays_ms": thinned([round(d, 2) for d in delays]),
    }


def thinned(ordered: list[float], most: int = 500) -> list[float]:
    """At most `most` of the sorted `ordered`, evenly by rank, the first and last kept: the same
    cumulative curve in the JSON and the plot, without 10,000 points per row."""
    if len(ordered) <= most:
        return ordered
    step = (len(ordered) - 1) / (most - 1)
    return [ordered[round(i * step)] for i in range(most)]
