"""`enqueue`: single-row vs bulk (COPY) enqueue rates from one connection, against the server's
own COPY rate into the same table (a pre-built buffer, no client work at all: the ceiling).

I/O on this machine varies from run to run by +-20%, so each path runs `repeat` times,
interleaved, and the median is reported with every run's figure; the ratio to the ceiling is
computed within each round before taking its median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.core import Result, reset
from dispatcher import JobSpec, enqueue_many_sync, enqueue_payloads_sync, enqueue_sync
from dispatcher.db import query


def _raw_copy(conn: psycopg.Connection[Any], jobs: int) -> float:
    now = conn.execute("SELECT now()").fetchone()[0].isoformat()  # type: ignore[index]
    # max_attempts 20, not given (max_attempts_given false), no dedupe key, no tags: what
    # enqueue_payloads writes by default.
    buffer = "".join(
        f'default\tnoop\t{{"i":{i}}}\t0\t{i % 64}\t20\tf\t{now}\t\\N\t\\N\n' for i in range(jobs)
    ).encode()
    started = time.perf_counter()
    with conn.transaction(), conn.cursor().copy(query("jobs_copy_in")) as copy:
        copy.write(buffer)
    return time.perf_counter() - started


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def enqueue_suite(dsn: str, result: Result, *, single: int, bulk: int, repeat: int = 3) -> None:
    runs: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(repeat):
            reset(conn)
            ceiling = bulk / _raw_copy(conn, bulk)
            paths = {
                "server COPY of a pre-built buffer (ceiling)": (bulk, lambda: None),
                "enqueue_payloads (one type, COPY)": (
                    bulk,
                    lambda: enqueue_payloads_sync(conn, "noop", ({"i": i} for i in range(bulk))),
                ),
                "enqueue_many (JobSpec list, COPY)": (
                    bulk,
                    lambda: enqueue_many_sync(
                        conn, [JobSpec("noop", {"i": i}) for i in range(bulk)]
                    ),
                ),
                "enqueue (one job per call, own transaction)": (
                    single,
                    lambda: [enqueue_sync(conn, "noop", {"i": i}) for i in range(single)],
                ),
            }
            for name, (n, fn) in paths.items():
                if fn is not None and name.startswith("server"):
                    rate = ceiling
                else:
                    reset(conn)
                    rate = n / _timed(fn)
                runs.setdefault(name, []).append(rate)
                ratios.setdefault(name, []).append(rate / ceiling)
    for name, rates in runs.items():
        n = single if name.startswith("enqueue (") else bulk
        result.add(
            path=name,
            jobs=n,
            jobs_per_s=round(statistics.median(rates)),
            ratio_to_ceiling=round(statistics.median(ratios[name]), 2),
            runs_jobs_per_s=[round(r) for r in rates],
        )
