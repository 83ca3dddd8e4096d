"""The scheduler's round against a real PostgreSQL: each slot gets one job whatever races, a changed
schedule moves to its new cadence's next slot, a removed one stops, runs' outcomes are recorded; and
an in-process worker runs a schedule's jobs with their slots. Times are the database's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from dispatcher import Job, Registry
from dispatcher.admin import list_schedules
from dispatcher.api.schedules.declarations import declare_schedule
from dispatcher.api.schedules.round import schedule_round
from dispatcher.api.schedules.scheduler import Scheduler
from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db.queries import query
from dispatcher.db.store import JobStore
from dispatcher.serve.worker import Worker
from dispatcher.settings.config import Config
from tests.helpers import fetchall, fetchval, run_async, run_worker_until
from tests.integration.test_cli_errors import cli, one_line_error

LOOKAHEAD_S = Scheduler.LOOKAHEAD_S


def round_once(dsn: str, declared, *, queue: str = "default", gone: str = "gone", stores: int = 1):
    """`stores` rounds of the queue at once, each on its own connection; their results."""

    async def go():
        opened = [JobStore(dsn, f"w{i}") for i in range(stores)]
        try:
            return await asyncio.gather(
                *(
                    schedule_round(
                        s,
                        queue,
                        declared,
                        gone=gone,
                        lookahead_s=LOOKAHEAD_S,
                        late_s=Scheduler.LATE_S,
                        keep_runs=1000,
                    )
                    for s in opened
                )
            )
        finally:
            for s in opened:
                await s.close()

    return run_async(go())


def slots(dsn: str, name: str) -> list[datetime]:
    rows = fetchall(
        dsn,
        "SELECT r.slot_at, j.scheduled_for, j.run_at FROM dispatcher_schedule_runs r "
        "JOIN dispatcher_jobs j ON j.id = r.job_id WHERE r.schedule_name = %s ORDER BY 1",
        (name,),
    )
    assert all(slot == scheduled == run_at for slot, scheduled, run_at in rows), rows
    return [r[0] for r in rows]


def db_now(dsn: str) -> datetime:
    return fetchval(dsn, "SELECT now()")


def test_rounds_enqueue_ahead_and_each_slot_gets_one_job_however_many_race(dsn):
    beat = declare_schedule("beat", every_s=2, job_type="tick", payload={"n": 1})
    before = db_now(dsn)
    for _ in range(3):
        round_once(dsn, [beat], stores=3)
    enqueued = slots(dsn, "beat")
    horizon = db_now(dsn) + timedelta(seconds=LOOKAHEAD_S)
    assert enqueued and all(s.timestamp() % 2 == 0 and before < s <= horizon for s in enqueued), (
        enqueued
    )
    assert enqueued == sorted(set(enqueued)) and len(enqueued) >= LOOKAHEAD_S / 2 - 1
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == len(enqueued)
    assert fetchval(dsn, "SELECT payload FROM dispatcher_jobs LIMIT 1") == {"n": 1}
    # The database refuses a second job for a slot, whoever asks: no row back, nothing inserted.
    params = {
        "name": "beat",
        "slot_at": enqueued[0],
        "queue": "default",
        "job_type": "tick",
        "payload": "{}",
        "priority": 0,
        "bucket": 0,
        "max_attempts": None,
        "channel": NOTIFY_CHANNEL,
        "notify": "default",
    }
    assert fetchall(dsn, query("schedule_enqueue_slot"), params) == []
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == len(enqueued)


def test_a_changed_schedule_moves_to_its_next_slot_and_a_removed_one_stops(dsn):
    round_once(dsn, [declare_schedule("beat", every_s=2, job_type="tick")])
    old = slots(dsn, "beat")
    assert old
    changed_at = db_now(dsn)
    round_once(dsn, [declare_schedule("beat", every_s=3, job_type="tick")])
    new = slots(dsn, "beat")
    assert new and all(s.timestamp() % 3 == 0 for s in new if s > changed_at), new
    # The old cadence's jobs enqueued ahead are gone with their slots; none had started.
    assert not [s for s in new if s > changed_at and s.timestamp() % 3 != 0]
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == len(new)

    removed_at = db_now(dsn)
    round_once(dsn, [])
    round_once(dsn, [])
    assert not [s for s in slots(dsn, "beat") if s > removed_at + timedelta(seconds=1)]
    (row,) = list_schedules(dsn)
    assert row.name == "beat" and row.removed_at is not None and row.next_slot_at is None
    # Declared again, it starts afresh from its next slot.
    round_once(dsn, [declare_schedule("beat", every_s=3, job_type="tick")])
    (row,) = list_schedules(dsn)
    assert row.removed_at is None and row.next_slot_at > db_now(dsn)


def test_runs_record_how_their_jobs_ended_and_the_last_success(dsn):
    beat = declare_schedule("beat", every_s=1, job_type="tick")
    round_once(dsn, [beat])
    first, second, third = slots(dsn, "beat")[:3]
    ids = {
        s: fetchval(dsn, "SELECT id FROM dispatcher_jobs WHERE scheduled_for = %s", (s,))
        for s in (first, second, third)
    }
    fetchall(
        dsn,
        "UPDATE dispatcher_jobs SET status = 'completed', updated_at = now() "
        "WHERE id = %s RETURNING id",
        (ids[first],),
    )
    fetchall(
        dsn,
        "UPDATE dispatcher_jobs SET status = 'failed', updated_at = now() "
        "WHERE id = %s RETURNING id",
        (ids[second],),
    )
    fetchall(dsn, "DELETE FROM dispatcher_jobs WHERE id = %s RETURNING id", (ids[third],))
    (done,) = round_once(dsn, [beat])
    outcomes = dict(
        fetchall(
            dsn, "SELECT slot_at, outcome FROM dispatcher_schedule_runs WHERE outcome IS NOT NULL"
        )
    )
    assert outcomes == {first: "completed", second: "failed", third: "gone"}
    success = fetchval(dsn, "SELECT last_success_at FROM dispatcher_schedules WHERE name = 'beat'")
    assert success is not None and done.last_success["beat"] == success.timestamp()
    # Under DISPATCHER_COMPLETED_JOBS=delete a success deletes its row: a run whose job is gone
    # completed.
    later = slots(dsn, "beat")[4]
    fetchall(dsn, "DELETE FROM dispatcher_jobs WHERE scheduled_for = %s RETURNING id", (later,))
    round_once(dsn, [beat], gone="completed")
    assert (
        fetchval(dsn, "SELECT outcome FROM dispatcher_schedule_runs WHERE slot_at = %s", (later,))
        == "completed"
    )


def test_schedules_list_on_the_command_line(dsn):
    round_once(
        dsn,
        [
            declare_schedule("nightly", "0 3 * * *", job_type="report", tz="Europe/Paris"),
            declare_schedule("beat", every_s=30, job_type="tick", catch_up="none"),
        ],
    )
    table = cli("schedules", "list", "--dsn", dsn)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:2] == ["name", "cadence"] and len(lines) == 3
    assert lines[2].split()[:7] == ["nightly", "0", "3", "*", "*", "*", "Europe/Paris"]
    listed = orjson.loads(cli("schedules", "list", "--json", "--dsn", dsn).stdout)
    assert [s["name"] for s in listed] == ["beat", "nightly"]
    nightly = listed[1]
    assert (
        nightly["cadence"] == "0 3 * * *"
        and nightly["catch_up"] == "latest"
        and nightly["last_outcome"] is None
    )
    next_slot = datetime.fromisoformat(nightly["next_slot_at"]).astimezone(UTC)
    assert next_slot.minute == 0 and next_slot.hour in (1, 2)  # 03:00 in Paris: CET or CEST
    assert cli("schedules", "list", "--queue", "elsewhere", "--dsn", dsn).stdout.startswith(
        "no schedules"
    )


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_worker_runs_each_slot_with_its_slot(dsn, mode):
    registry = Registry()
    seen: list[tuple[int, datetime | None, datetime]] = []

    @registry.handler("tick", schedule=None)
    async def tick(job: Job) -> None:
        seen.append((job.id, job.scheduled_for, datetime.now(UTC)))

    registry.schedule("every-second", every_s=1, job_type="tick")
    config = Config(dsn=dsn, mode=mode, poll_interval_s=0.2, flush_interval_s=0.02)
    worker = Worker(config, registry)
    run_async(run_worker_until(worker, lambda: len(seen) >= 3, 30, "three slots run"))
    assert all(
        at is not None and at.tzinfo is not None and at.microsecond == 0 for _, at, _ in seen
    ), seen
    assert len({at for _, at, _ in seen}) == len(seen)
    for job_id, at, _started in seen:
        assert (
            fetchval(dsn, "SELECT scheduled_for FROM dispatcher_jobs WHERE id = %s", (job_id,))
            == at
        )


def test_a_worker_with_a_bad_schedule_refuses_to_start_naming_it(dsn, tmp_path):
    (tmp_path / "bad_cron_app.py").write_text(
        "from dispatcher import Registry\nregistry = Registry()\n"
        "registry.schedule('nightly', '0 25 * * *', job_type='report')\n"
    )
    (tmp_path / "orphan_app.py").write_text(
        "from dispatcher import Registry\nregistry = Registry()\n"
        "registry.schedule('nightly', '0 3 * * *', job_type='report')\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    line = one_line_error(
        cli("run", "--app", "bad_cron_app:registry", "--dsn", dsn, env=env), 2, "--app"
    )
    assert "schedule 'nightly': bad cron expression '0 25 * * *'" in line
    line = one_line_error(
        cli("run", "--app", "orphan_app:registry", "--dsn", dsn, env=env), 2, "--app"
    )
    assert "schedule 'nightly': job_type 'report' has no handler" in line
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0
