"""The worker registry as operators read it: `dispatcher status` (text and JSON) lists every live
worker, whatever its mode and coordinator, and counts those gone within the hour; the table
sampler's holder exports `dispatcher_workers{mode,coordinator}`; and real workers of both modes
appear there while they run and leave at once when they stop."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import psycopg

from dispatcher import Config, Registry, Worker
from dispatcher.api.status import read_status, render_status
from dispatcher.db.store import JobStore
from dispatcher.runtime.table_sampler import TableCollector, TableSampler
from tests.helpers import collected, run_async, wait_until_async
from tests.integration.test_cli_errors import cli

# (worker_id, mode, coordinator, state): the rows a fleet of three live workers of different
# modes and coordinators leaves, beside one killed (its lease ran out), one stopped cleanly and
# one gone for longer than an hour (a row not pruned yet).
FLEET = (
    ("w-part", "partitioned", "postgres", "live"),
    ("w-skip", "skip_locked", "static", "live"),
    ("w-redis", "partitioned", "redis", "live"),
    ("w-killed", "partitioned", "postgres", "expired"),
    ("w-stopped", "skip_locked", "static", "stopped"),
    ("w-old", "partitioned", "redis", "old"),
)
LIVE = {
    "w-part": ("partitioned", "postgres"),
    "w-skip": ("skip_locked", "static"),
    "w-redis": ("partitioned", "redis"),
}

# The state of a row, as its timestamps say it (seconds before now: started, last seen; the
# lease's end from now; stopped). A live row's lease runs an hour: the test never races it.
STATES = {
    "live": ("125 seconds", "0.5 seconds", "1 hour", None),
    "expired": ("300 seconds", "20 seconds", "-14 seconds", None),
    "stopped": ("600 seconds", "30 seconds", "-30 seconds", "30 seconds"),
    "old": ("3 hours", "2 hours", "-2 hours", None),
}


def register(
    conn: psycopg.Connection[Any],
    worker_id: str,
    mode: str,
    coordinator: str,
    state: str = "live",
    *,
    host: str = "pod-a",
    queues: tuple[str, ...] = ("default", "mail"),
    running: int = 3,
) -> None:
    """A row of dispatcher_workers as heartbeats (and a stop, or a death) leave it."""
    started, seen, lease, stopped = STATES[state]
    conn.execute(
        "INSERT INTO dispatcher_workers (worker_id, host, pid, version, mode, coordinator, queues, "
        "job_types, concurrency, running, started_at, seen_at, expires_at, stopped_at) "
        "VALUES (%(id)s, %(host)s, 4242, '9.9.9', %(mode)s, %(coordinator)s, %(queues)s, "
        "'{send_email,resize}', 20, %(running)s, now() - %(started)s::interval, "
        "now() - %(seen)s::interval, now() + %(lease)s::interval, "
        "now() - %(stopped)s::interval)",
        {
            "id": worker_id,
            "host": host,
            "mode": mode,
            "coordinator": coordinator,
            "queues": list(queues),
            "running": running if state == "live" else 0,
            "started": started,
            "seen": seen,
            "lease": lease,
            "stopped": stopped,
        },
    )


def register_fleet(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for worker_id, mode, coordinator, state in FLEET:
            register(conn, worker_id, mode, coordinator, state)


def test_status_lists_the_live_workers_of_every_mode_and_coordinator_and_counts_the_gone(dsn):
    register_fleet(dsn)

    status = read_status(dsn)
    workers = {w["id"]: w for w in status["workers"]}
    assert {i: (w["mode"], w["coordinator"]) for i, w in workers.items()} == LIVE
    w = workers["w-skip"]
    assert (w["host"], w["pid"], w["version"], w["queues"]) == (
        "pod-a",
        4242,
        "9.9.9",
        ["default", "mail"],
    )
    assert (w["running"], w["concurrency"], w["job_types"]) == (3, 20, ["send_email", "resize"])
    assert 124 <= w["up_s"] < 200 and 0.4 <= w["heartbeat_age_s"] < 60
    assert (status["workers_gone"], status["workers_vanished"]) == (2, 1)
    assert status["groups"] == {}, "no worker of the PostgreSQL coordinator's tables"

    result = cli("status", "--json", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    listed = orjson.loads(result.stdout)
    assert isinstance(listed["workers"], list)
    assert {w["id"]: (w["mode"], w["coordinator"]) for w in listed["workers"]} == LIVE
    assert listed["workers_gone"] == 2

    result = cli("status", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (head,) = [line for line in lines if line.startswith("workers: ")]
    assert head.startswith("workers: 3 live "), head
    assert "2 gone within the hour (1 stopped, 1 lease ran out" in head, head
    table = lines[lines.index(head) + 1 : lines.index(head) + 5]
    assert table[0].split() == [
        "worker",
        "host",
        "pid",
        "version",
        "mode",
        "coordinator",
        "queues",
        "running",
        "up",
        "heartbeat",
    ]
    rows = {r.split()[0]: r.split() for r in table[1:]}
    assert set(rows) == set(LIVE), table
    for worker_id, (mode, coordinator) in LIVE.items():
        cells = rows[worker_id]
        assert cells[1:8] == ["pod-a", "4242", "9.9.9", mode, coordinator, "default,mail", "3/20"]
        assert cells[8] == "2m", cells  # up 125 s
    assert "w-killed" not in result.stdout and "w-stopped" not in result.stdout
    assert "coordination groups: none" in result.stdout


def test_the_table_samplers_holder_exports_the_live_workers_per_mode_and_coordinator(dsn):
    register_fleet(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        register(conn, "w-part-2", "partitioned", "postgres", "live")
    collector = TableCollector()

    def gauge() -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["mode"], dict(labels)["coordinator"]): value
            for (name, labels), value in collected(collector).items()
            if name == "dispatcher_workers"
        }

    async def main() -> list[dict[tuple[str, str], float]]:
        store = JobStore(dsn, "sampler", application_name="dispatcher-maint")
        sampler = TableSampler(store, interval_s=5.0)
        collector.track(sampler)
        try:
            await sampler.tick()
            assert sampler.holding
            first = gauge()
            stop = "UPDATE dispatcher_workers SET stopped_at = now() WHERE mode = 'skip_locked'"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(stop)
            await sampler.tick()
            return [first, gauge()]
        finally:
            await store.close()

    first, after_stop = run_async(main())
    # One series per pair of a live worker, each the count of its live ones.
    assert first == {
        ("partitioned", "postgres"): 2,
        ("partitioned", "redis"): 1,
        ("skip_locked", "static"): 1,
    }
    # A pair whose workers are all gone reads 0 while their rows stay (an hour).
    assert after_stop == {**first, ("skip_locked", "static"): 0}


def config(dsn: str, worker_id: str, mode: str) -> Config:
    return Config(
        dsn=dsn,
        worker_id=worker_id,
        mode=mode,
        queues=("default",),
        concurrency=7,
        poll_interval_s=0.2,
        coordinator_poll_s=0.2,
    )


def test_real_workers_of_both_modes_are_live_in_status_and_leave_it_when_they_stop(dsn):
    registry = Registry()
    registry.handler("noop")(lambda job: None)
    partitioned = Worker(config(dsn, "reg-part", "partitioned"), registry)
    skip_locked = Worker(config(dsn, "reg-skip", "skip_locked"), registry)

    def live() -> dict[str, dict[str, Any]]:
        return {w["id"]: w for w in read_status(dsn)["workers"]}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        tasks = [asyncio.create_task(w.run()) for w in (partitioned, skip_locked)]
        try:

            async def both() -> dict[str, Any] | None:
                for task in tasks:
                    if task.done():
                        task.result()
                        raise AssertionError("a worker exited before it was seen live")
                seen = await asyncio.to_thread(live)
                return seen if set(seen) == {"reg-part", "reg-skip"} else None

            seen = await wait_until_async(both, 30, "both workers live in the registry")
        finally:
            for worker in (partitioned, skip_locked):
                worker.stop()
            await asyncio.gather(*tasks)
        return seen, await asyncio.to_thread(read_status, dsn)

    seen, after = run_async(main())
    assert (seen["reg-part"]["mode"], seen["reg-part"]["coordinator"]) == (
        "partitioned",
        "postgres",
    )
    assert seen["reg-skip"]["mode"] == "skip_locked"
    for w in seen.values():
        assert w["queues"] == ["default"] and w["concurrency"] == 7
        assert w["job_types"] == ["noop"] and w["heartbeat_age_s"] < 10
    text = render_status(after)
    # A clean stop leaves the live view at once: gone, and not vanished.
    assert after["workers"] == [], after["workers"]
    assert (after["workers_gone"], after["workers_vanished"]) == (2, 0)
    assert "workers: 0 live" in text and "2 gone within the hour (2 stopped, 0 lease" in text


def test_status_names_the_job_types_no_live_worker_serves_with_their_waiting_and_discarded_jobs(
    dsn,
):
    """A rollout's new type before its first pod is live, or a type nobody handles: its queued
    jobs, and those discarded once nobody served it lately, show per queue and type."""
    from dispatcher import enqueue_sync
    from dispatcher.constants import UNSERVED_DISCARD_PREFIX

    with psycopg.connect(dsn, autocommit=True) as conn:
        register(
            conn, "w-live", "partitioned", "postgres", queues=("default",)
        )  # serves send_email
        register(conn, "w-gone", "partitioned", "postgres", "expired", queues=("default",))
        for job_type in ("send_email", "new_type", "new_type"):
            enqueue_sync(conn, job_type, {})
        enqueue_sync(conn, "send_email", {}, queue="mail")  # no live worker serves queue mail
        gone = enqueue_sync(conn, "removed_type", {})
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'discarded', last_error = %s WHERE id = %s",
            (f"{UNSERVED_DISCARD_PREFIX} job_type 'removed_type' for 3600 s", gone),
        )
    status = read_status(dsn)
    assert status["unserved_types"] == [
        {"queue": "default", "job_type": "new_type", "waiting": 2, "discarded": 0},
        {"queue": "default", "job_type": "removed_type", "waiting": 0, "discarded": 1},
        {"queue": "mail", "job_type": "send_email", "waiting": 1, "discarded": 0},
    ]
    text = render_status(status)
    assert "job types no live worker serves" in text
    assert "default/new_type: 2 waiting, 0 discarded as unserved" in text
    shown = cli("status", "--json", "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["unserved_types"] == status["unserved_types"]


def test_a_process_that_reuses_a_worker_id_writes_its_own_start_and_identity(dsn):
    """A fixed worker id (a pod's name) restarted by a new release: its row says the new process's
    start and version, so the schedules of the newest release still win (runtime/presence.py)."""
    from dispatcher.runtime.presence import Identity, Presence

    def presence(store: JobStore, job_types: tuple[str, ...]) -> Presence:
        ident = Identity("pod-0", "partitioned", "postgres", ("default",), job_types, 10, {})
        return Presence(store, ident, lambda: 0, unserved_window_s=3600)

    async def go() -> list[Any]:
        store = JobStore(dsn, "pod-0")
        try:
            first = presence(store, ("a",))
            await first.tick()
            await first.tick()
            await first.leave()
            second = presence(store, ("a", "b"))
            await second.tick()
            return [first.started_at, second.started_at]
        finally:
            await store.close()

    before, after = run_async(go())
    assert before is not None and after is not None and after > before
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT job_types, started_at, stopped_at FROM dispatcher_workers "
            "WHERE worker_id = 'pod-0'"
        ).fetchone()
    assert row == (["a", "b"], after, None)
