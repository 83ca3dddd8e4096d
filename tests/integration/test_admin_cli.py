"""`dispatcher jobs list|show|retry|cancel|purge` in a subprocess: output, bulk confirmation, exit
codes, and bad input refused with exit 2 naming the flag before anything is read or written."""

import re

import orjson
import psycopg
import pytest

from dispatcher import Config, Registry, Worker, enqueue_sync
from tests.helpers import fetchval, run_async, run_worker_until
from tests.integration.test_admin import add, statuses
from tests.integration.test_cli_errors import cli, one_line_error


def jobs(dsn, *args):
    return cli("jobs", *args, "--dsn", dsn)


def test_list_prints_a_table_or_json(dsn):
    failed = add(
        dsn,
        2,
        status="failed",
        queue="mail",
        job_type="send",
        age_s=7200,
        last_error="Traceback (most recent call last):\n  ...\nValueError: no such customer",
    )
    add(dsn, 3)
    table = jobs(dsn, "list", "--status", "failed")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "queue", "type", "status"] and len(lines) == 3
    assert lines[1].split()[:6] == [str(failed[1]), "mail", "send", "failed", "0/20", "2h00m"]
    assert lines[1].endswith("ValueError: no such customer")
    listed = orjson.loads(
        jobs(dsn, "list", "--status", "failed,queued", "--limit", "4", "--json").stdout
    )
    assert len(listed) == 4 and {j["status"] for j in listed} <= {"failed", "queued"}
    assert jobs(dsn, "list", "--queue", "nowhere").stdout.strip() == "(no jobs match)"


def test_show_prints_the_job_and_its_last_error_and_a_missing_one_exits_1(dsn):
    (job_id,) = add(dsn, status="failed", last_error="Traceback ...\nKeyError: 'x'")
    shown = jobs(dsn, "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job {job_id} (failed)") and "KeyError: 'x'" in shown.stdout
    assert "attempts: none recorded" in shown.stdout
    assert orjson.loads(jobs(dsn, "show", str(job_id), "--json").stdout)["job"]["id"] == job_id
    one_line_error(jobs(dsn, "show", "999999"), 1, "no job 999999")


def test_retry_by_id_acts_at_once_and_exits_1_when_an_id_was_skipped(dsn):
    failed, running = add(dsn, status="failed")[0], add(dsn, status="running")[0]
    done = jobs(dsn, "retry", str(failed))
    assert done.returncode == 0 and done.stdout.startswith("retried 1 of 1 jobs"), done
    assert statuses(dsn, [failed]) == ["queued"]
    skipped = jobs(dsn, "retry", "--id", str(running))
    assert skipped.returncode == 1
    assert f"{running}: it is running: retry applies to failed, discarded jobs" in skipped.stdout
    assert statuses(dsn, [running]) == ["running"]


def test_a_bulk_change_prints_the_count_and_needs_yes(dsn):
    old = add(dsn, 3, status="completed", age_s=3 * 86400)
    young = add(dsn, 2, status="completed", age_s=60)
    asked = jobs(dsn, "purge", "--status", "completed", "--older-than", "2d")
    assert asked.returncode == 1, asked
    assert (
        asked.stdout.strip() == "3 jobs match; nothing was changed: re-run with --yes to purge them"
    )
    assert statuses(dsn, old) == ["completed"] * 3
    done = jobs(dsn, "purge", "--status", "completed", "--older-than", "2d", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert (result["action"], result["changed_count"], sorted(result["changed"])) == (
        "purge",
        3,
        old,
    )
    assert statuses(dsn, old + young) == [None] * 3 + ["completed"] * 2
    nothing = jobs(dsn, "purge", "--status", "completed", "--older-than", "2d")
    assert (nothing.returncode, nothing.stdout.strip()) == (0, "no jobs match: nothing to purge")


def test_cancel_all_needs_all_and_yes_and_leaves_finished_jobs_alone(dsn):
    queued, running, failed = add(dsn, 2), add(dsn, status="running"), add(dsn, status="failed")
    one_line_error(jobs(dsn, "cancel", "--yes"), 2, "arguments", "--all")  # nothing named: refused
    done = jobs(dsn, "cancel", "--all", "--yes")
    assert done.returncode == 0, done
    assert done.stdout.splitlines()[0] == "cancelled 2 of 3 jobs (cancelled): " + ", ".join(
        map(str, queued)
    )
    requested = (
        "cancel requested for 1 running jobs (cancelled at their owner's next heartbeat): "
        f"{running[0]}"
    )
    assert requested in done.stdout
    assert statuses(dsn, queued + running + failed) == [
        "cancelled",
        "cancelled",
        "running",
        "failed",
    ]


@pytest.mark.parametrize(
    "args, named",
    [
        (["list", "--status", "nope"], "--status"),
        (["list", "--status", "failed,bogus"], "--status"),
        (["list", "--older-than", "-5"], "--older-than"),
        (["list", "--newer-than", "3 weeks"], "--newer-than"),
        (["list", "--limit", "0"], "--limit"),
        (["list", "--limit", "ten"], "--limit"),
        (["list", "--queue", "we ird"], "--queue"),
        (["retry", "12x"], "ids"),
        (["retry", "--id", "-3"], "--id"),
        (["show", "abc"], "id"),
        (["retry", "--status", "running", "--yes"], "--status"),
        (["purge", "--status", "queued", "--yes"], "--status"),
        (["cancel", "--all", "--yes", "--batch", "0"], "--batch"),
    ],
)
def test_bad_input_exits_2_naming_the_flag_and_changes_nothing(dsn, args, named):
    ids = add(dsn, status="failed") + add(dsn)
    one_line_error(jobs(dsn, *args), 2, named)
    assert statuses(dsn, ids) == ["failed", "queued"]
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 2


def test_show_lists_the_error_of_every_failed_attempt_of_a_job_a_worker_ran(dsn):
    """Every attempt's error on the job, by default (no DISPATCHER_HISTORY): three failures of a
    real worker's handler, three errors in `jobs show`, its JSON and the store's row."""
    registry = Registry()

    @registry.handler("flaky", max_attempts=3, retry_base_s=0.01, retry_cap_s=0.02)
    def flaky(job):
        raise ValueError(f"attempt {job.attempts} went wrong")

    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = enqueue_sync(conn, "flaky", {})
    worker = Worker(Config(dsn=dsn, poll_interval_s=0.1, flush_interval_s=0.01), registry)
    run_async(
        run_worker_until(
            worker,
            lambda: statuses(dsn, [job_id]) == ["failed"],
            30,
            "the job failed for good",
        )
    )
    shown = jobs(dsn, "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert "errors of its failed attempts (3, oldest first):" in shown.stdout
    for n in (1, 2, 3):
        assert re.search(rf"#{n} .*ValueError: attempt {n} went wrong", shown.stdout), shown.stdout
    errors = orjson.loads(jobs(dsn, "show", str(job_id), "--json").stdout)["job"]["errors"]
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert all(
        e["error"].endswith(f"ValueError: attempt {e['attempt']} went wrong") for e in errors
    )
