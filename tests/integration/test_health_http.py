"""/livez, /readyz and /metrics over real HTTP from real worker processes (`dispatcher run`),
against a real PostgreSQL (and a real Redis for the coordinator outage)."""

import asyncio
import math
import shutil
import signal
import subprocess
import time
import urllib.request

import orjson
import psycopg
import pytest

from dispatcher import JobSpec, enqueue_many_sync
from dispatcher.db.migrate import migrate
from dispatcher.serve.startup import StartupError, wait_until_ready
from dispatcher.settings.config import Config
from tests.helpers import (
    fetchall,
    http_get,
    metric_samples,
    run_async,
    start_serving_worker,
    status_counts,
    stop_workers,
    wait_until,
)

pytestmark = pytest.mark.slow

APP = "tests.apps.probes:registry"
FAST = dict(
    poll_interval_s=0.2,
    flush_interval_s=0.02,
    reaper_interval_s=0.3,
    table_sample_interval_s=0.5,
    retry_base_s=0.05,
    retry_cap_s=0.1,
)
READY = {"worker": "running", "database": "ok", "schema": "current", "assignment": "owned"}

# The janitor holds a lease in the same table (janitor.Pruner): only the sampler's row here.
SAMPLER_HOLDER = "SELECT holder FROM dispatcher_maintenance_leases WHERE name = 'table_sampler'"


def get_json(port, path):
    answer = http_get(port, path)
    assert answer is not None, f"nothing answered {path} on port {port}"
    return answer[0], orjson.loads(answer[1])


def scrape(port) -> str:
    answer = http_get(port, "/metrics")
    assert answer is not None and answer[0] == 200, answer
    return answer[1].decode()


def value(text: str, name: str, **labels) -> float | None:
    return metric_samples(text).get((name, tuple(sorted(labels.items()))))


def names(text: str) -> set[str]:
    return {name for name, _ in metric_samples(text)}


def enqueue(dsn, specs):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_many_sync(conn, specs)


def test_probes_answer_and_the_metrics_count_the_jobs_run(dsn, tmp_path):
    enqueue(
        dsn,
        [JobSpec("flaky", {"s": 0.03}) for _ in range(5)]
        + [JobSpec("flaky", {"s": 0.03, "fail_attempts": 1}) for _ in range(2)],
    )
    log = tmp_path / "w.out"
    worker, port = start_serving_worker(dsn, log, app=APP, **FAST)
    try:
        wait_until(
            lambda: status_counts(dsn) == {"completed": 7}, 60, "7 jobs completed (2 after a retry)"
        )
        code, body = get_json(port, "/livez")
        assert code == 200 and body["status"] == "ok" and 0 <= body["loop_heartbeat_age_s"] < 10, (
            body
        )
        # Ready once its group's first assignment is made (a lone member's waits 1 s to settle).
        wait_until(
            lambda: (
                get_json(port, "/readyz")
                == (200, {"status": "ready", "checks": READY, "paused_queues": []})
            ),
            10,
            lambda: f"ready: {get_json(port, '/readyz')}",
        )
        for path in ("/healthz", "/", "/metrics/extra"):
            code, body = get_json(port, path)
            assert code == 404 and body["status"] == "not found" and body["path"] == path, body
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"

        # Outcomes are counted as decided: 7 completed, 2 retried; 9 attempts ran, each >= 30 ms.
        # The table sample is taken every 0.5 s: wait for one from after the last job finished.
        def settled(t):
            return all(
                value(t, "dispatcher_queue_jobs", queue="default", status=status) == 0
                for status in ("queued", "scheduled", "running", "failed")
            )

        text = wait_until(
            lambda: (
                (t := scrape(port))
                and value(
                    t,
                    "dispatcher_job_outcomes_total",
                    queue="default",
                    job_type="flaky",
                    outcome="completed",
                )
                == 7
                and settled(t)
                # a lone member's first assignment waits for its group to settle (1 s)
                and value(t, "dispatcher_coordinator_owned_buckets", queue="default") == 64
                and t
            ),
            20,
            "the scrape shows 7 completions, a table sample of none left and 64 buckets owned",
        )
        flaky = {
            outcome: value(
                text,
                "dispatcher_job_outcomes_total",
                queue="default",
                job_type="flaky",
                outcome=outcome,
            )
            for outcome in ("completed", "retried", "failed", "discarded", "cancelled")
        }
        assert flaky == {"completed": 7, "retried": 2, "failed": 0, "discarded": 0, "cancelled": 0}
        assert (
            value(text, "dispatcher_job_duration_seconds_count", queue="default", job_type="flaky")
            == 9
        )
        assert (
            value(
                text,
                "dispatcher_job_duration_seconds_bucket",
                queue="default",
                job_type="flaky",
                le="+Inf",
            )
            == 9
        )
        assert (
            value(
                text,
                "dispatcher_job_duration_seconds_bucket",
                queue="default",
                job_type="flaky",
                le="0.025",
            )
            == 0
        )
        assert (
            value(text, "dispatcher_job_duration_seconds_sum", queue="default", job_type="flaky")
            >= 9 * 0.03
        )
        assert value(text, "dispatcher_job_timeouts_total", queue="default", job_type="flaky") == 0
        assert value(text, "dispatcher_jobs_running", queue="default") == 0
        assert value(text, "dispatcher_ready") == 1
        assert 0 <= value(text, "dispatcher_loop_heartbeat_age_seconds") < 10
        assert value(text, "dispatcher_coordinator_owned_buckets", queue="default") == 64
        assert 0 <= value(text, "dispatcher_coordinator_heartbeat_age_seconds") < 10
        assert [k for k in metric_samples(text) if k[0] == "dispatcher_build_info"] and value(
            text, "dispatcher_build_info", version=_version()
        ) == 1
        # The only worker samples the table: every table-wide series is there.
        assert value(text, "dispatcher_table_sampler") == 1
        assert value(text, "dispatcher_queue_oldest_runnable_age_seconds", queue="default") == 0
        assert {
            "dispatcher_db_dead_tuples",
            "dispatcher_db_live_tuples",
            "dispatcher_db_claim_index_tuples_read_total",
            "dispatcher_db_lock_waits",
            "dispatcher_db_active_sessions",
        } <= names(text)
        assert 0 <= value(text, "dispatcher_table_sample_age_seconds") < 10
        promtool_is_clean(text)
    finally:
        codes = stop_workers([worker])
    assert codes == [0], log.read_text()[-3000:]


def _version():
    from importlib.metadata import version

    return version("bucket-dispatcher")


def promtool_is_clean(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool is not installed (Debian: apt-get install prometheus); the rest passed"
        )
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), (
        checked.stdout + checked.stderr
    )


def test_a_blocked_event_loop_fails_livez_and_readyz_until_it_runs_again(dsn, tmp_path):
    log = tmp_path / "w.out"
    worker, port = start_serving_worker(dsn, log, app=APP, loop_stall_s=2, **FAST)
    try:
        wait_until(lambda: get_json(port, "/readyz")[0] == 200, 30, "ready")
        enqueue(dsn, [JobSpec("block_loop", {"s": 8})])
        code, body = wait_until(
            lambda: (a := get_json(port, "/livez"))[0] == 503 and a, 30, "/livez 503"
        )
        assert body["status"] == "stalled" and body["loop_heartbeat_age_s"] > 2, body
        # The server's own thread answers the rest too, while the loop is blocked.
        code, body = get_json(port, "/readyz")
        assert code == 503 and body["checks"]["worker"] == "stalled", body
        text = scrape(port)
        assert value(text, "dispatcher_loop_heartbeat_age_seconds") > 2
        # Computed at scrape time: it grows while the loop (where heartbeats are sent) is stuck.
        before = value(text, "dispatcher_coordinator_heartbeat_age_seconds")
        wait_until(
            lambda: (
                value(scrape(port), "dispatcher_coordinator_heartbeat_age_seconds") >= before + 1
            ),
            10,
            "the coordinator's heartbeat age growing while the loop is blocked",
        )
        assert value(text, "dispatcher_ready") == 0
        assert value(text, "dispatcher_jobs_running", queue="default") == 1
        wait_until(
            lambda: get_json(port, "/livez")[0] == 200,
            30,
            "/livez 200 again once the handler returned",
        )
        wait_until(lambda: get_json(port, "/readyz")[0] == 200, 30, "/readyz 200 again")
        wait_until(lambda: status_counts(dsn) == {"completed": 1}, 30, "the blocking job completed")
    finally:
        codes = stop_workers([worker])
    assert codes == [0], log.read_text()[-3000:]


def test_a_worker_waiting_for_the_schema_is_alive_not_ready_until_migrated(empty_dsn, tmp_path):
    log = tmp_path / "w.out"
    worker, port = start_serving_worker(empty_dsn, log, app=APP, wait_for_schema="true", **FAST)
    try:
        code, body = wait_until(
            lambda: (a := get_json(port, "/readyz"))[1]["checks"]["schema"] == "missing" and a,
            30,
            "/readyz naming the missing schema",
        )
        assert code == 503 and body == {
            "status": "not ready",
            "checks": {
                "worker": "starting",
                "database": "ok",
                "schema": "missing",
                "assignment": "not started",
            },
            "paused_queues": [],
        }
        assert get_json(port, "/livez")[0] == 200
        assert value(scrape(port), "dispatcher_ready") == 0
        migrate(empty_dsn)
        wait_until(
            lambda: (
                get_json(port, "/readyz")
                == (200, {"status": "ready", "checks": READY, "paused_queues": []})
            ),
            30,
            "ready once migrated",
        )
    finally:
        codes = stop_workers([worker])
    assert codes == [0], log.read_text()[-3000:]


def test_the_startup_check_requires_the_maintenance_leases_migration(dsn):
    """startup.py compares the applied versions with every shipped migration, so a database
    without 0006 is `older`: not ready, and without --wait-for-schema the worker exits."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE dispatcher_maintenance_leases")
        conn.execute("DELETE FROM dispatcher_schema_version WHERE version = 6")
    states = []
    limits = Config(dsn=dsn).database.limits
    with pytest.raises(StartupError, match=r"migrations \[6\] not applied"):
        run_async(
            wait_until_ready(
                dsn,
                limits,
                wait_for_schema=False,
                stopping=asyncio.Event(),
                on_state=lambda *state: states.append(state),
            )
        )
    assert states == [("ok", "older")]
    migrate(dsn)
    assert run_async(
        wait_until_ready(
            dsn,
            limits,
            wait_for_schema=False,
            stopping=asyncio.Event(),
            on_state=lambda *state: states.append(state),
        )
    )
    assert states[-1] == ("ok", "current")


def test_a_coordinator_outage_leaves_the_worker_ready_and_degraded(dsn, tmp_path):
    from dispatcher.devtools.embedded import start_redis

    log = tmp_path / "w.out"
    with start_redis() as redis_server:
        worker, port = start_serving_worker(
            dsn,
            log,
            app=APP,
            coordinator="redis",
            redis_url=redis_server.url,
            coordinator_lease_s=3,
            coordinator_poll_s=0.5,
            **FAST,
        )
        try:
            wait_until(
                lambda: (
                    get_json(port, "/readyz")
                    == (200, {"status": "ready", "checks": READY, "paused_queues": []})
                ),
                30,
                "ready, owning its buckets",
            )
            redis_server.kill()
            answers = []

            def degraded():
                answers.append(get_json(port, "/readyz"))
                return answers[-1][1]["checks"]["assignment"] == "degraded"

            wait_until(degraded, 30, lambda: f"assignment degraded; saw {answers[-3:]}")
            assert all(code == 200 for code, _ in answers), [a for a in answers if a[0] != 200][:3]
            assert answers[-1] == (
                200,
                {
                    "status": "ready",
                    "checks": {**READY, "assignment": "degraded"},
                    "paused_queues": [],
                },
            )
            text = scrape(port)
            assert value(text, "dispatcher_coordinator_degraded") == 1
            # grows: no heartbeat lands
            assert value(text, "dispatcher_coordinator_heartbeat_age_seconds") >= 3
            # degraded: still works, by SKIP LOCKED
            enqueue(dsn, [JobSpec("flaky", {}) for _ in range(3)])
            wait_until(
                lambda: status_counts(dsn) == {"completed": 3}, 30, "jobs done while degraded"
            )
        finally:
            codes = stop_workers([worker])
    assert codes == [0], log.read_text()[-3000:]


def test_one_worker_exports_the_table_wide_series_and_another_takes_over_when_it_stops(
    dsn, tmp_path
):
    interval_s = 1.0  # the lease: 3 s
    enqueue(dsn, [JobSpec("flaky", {}, delay_s=3600) for _ in range(4)])  # scheduled: stays put
    settings = {**FAST, "table_sample_interval_s": interval_s}
    workers = {}
    for name in ("a", "b"):
        workers[name] = start_serving_worker(
            dsn, tmp_path / f"{name}.out", app=APP, worker_id=f"w-{name}", **settings
        )
    procs = [proc for proc, _ in workers.values()]
    try:

        def roles():
            texts = {name: scrape(port) for name, (_, port) in workers.items()}
            holders = [
                name for name, t in texts.items() if value(t, "dispatcher_table_sampler") == 1
            ]
            exporting = [name for name, t in texts.items() if "dispatcher_queue_jobs" in names(t)]
            return (holders, exporting, texts) if holders and holders == exporting else None

        holders, _exporting, texts = wait_until(
            roles, 30, "one worker holding the sampler role and exporting"
        )
        assert len(holders) == 1, holders
        holder, other = holders[0], "b" if holders[0] == "a" else "a"
        assert fetchall(dsn, SAMPLER_HOLDER) == [(f"w-{holder}",)]
        assert (
            value(texts[holder], "dispatcher_queue_jobs", queue="default", status="scheduled") == 4
        )
        quiet = texts[other]
        assert value(quiet, "dispatcher_table_sampler") == 0
        assert value(quiet, "dispatcher_table_sample_age_seconds") == math.inf
        table_wide = {
            "dispatcher_queue_jobs",
            "dispatcher_queue_halted_keys",
            "dispatcher_queue_oldest_runnable_age_seconds",
            "dispatcher_db_dead_tuples",
            "dispatcher_db_live_tuples",
            "dispatcher_db_claim_index_tuples_read_total",
            "dispatcher_db_lock_waits",
            "dispatcher_db_active_sessions",
        }
        assert not table_wide & names(quiet), table_wide & names(quiet)
        assert table_wide <= names(texts[holder])

        holder_proc, _ = workers[holder]
        holder_proc.send_signal(signal.SIGTERM)
        assert holder_proc.wait(timeout=30) == 0
        stopped_at = time.monotonic()
        _, other_port = workers[other]
        wait_until(
            lambda: (
                value(
                    scrape(other_port), "dispatcher_queue_jobs", queue="default", status="scheduled"
                )
                == 4
            ),
            30,
            "the other worker exporting the table-wide series",
        )
        took_over_s = time.monotonic() - stopped_at
        print(
            f"table sampler taken over {took_over_s:.2f} s after the holder exited "
            f"(lease {3 * interval_s:g} s)"
        )
        assert took_over_s < 3 * interval_s, "the released role was not taken within the lease"
        assert fetchall(dsn, SAMPLER_HOLDER) == [(f"w-{other}",)]
    finally:
        codes = stop_workers(procs)
    assert codes == [0, 0], [(tmp_path / f"{n}.out").read_text()[-2000:] for n in workers]
