"""The CLI against a database: every `enqueue` flag holds for each --count copy or is refused,
a payload too big for a command line comes from a file or standard input, command groups list
without a subcommand, a list cut short says so, `limits set` labels what it set, and the admin
commands refuse a queue name no job can have, as enqueue does, before anything is written."""

import os
import subprocess
import sys

import orjson
import psycopg
import pytest

from dispatcher.api.enqueue import bucket_for
from tests.helpers import ROOT, fetchall, fetchval
from tests.integration.test_admin import add
from tests.integration.test_cli_errors import cli, one_line_error

MIB = 1 << 20


def cli_with_input(*args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    """`dispatcher ARGS` with `stdin` on its standard input (bytes in, bytes out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def jobs_written(dsn: str) -> int:
    return fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs")


# -- enqueue --count -------------------------------------------------------------------------------


def test_count_puts_every_copy_in_the_partition_keys_bucket(dsn):
    result = cli("enqueue", "hello", "--count", "5", "--partition-key", "hot", "--dsn", dsn)
    assert result.returncode == 0 and result.stdout.strip() == "enqueued 5 jobs", result.stderr
    assert fetchall(dsn, "SELECT bucket, count(*) FROM dispatcher_jobs GROUP BY bucket") == [
        (bucket_for("hot"), 5)
    ]


def test_count_with_an_ordering_key_keys_every_copy_and_a_disagreeing_partition_key_is_refused(
    dsn,
):
    ok = cli("enqueue", "hello", "--count", "3", "--ordering-key", "acct-1", "--dsn", dsn)
    assert ok.returncode == 0, ok.stderr
    assert fetchall(
        dsn, "SELECT DISTINCT ordering_key, bucket FROM dispatcher_jobs ORDER BY 1"
    ) == [("acct-1", bucket_for("acct-1"))]
    other = next(k for k in (f"p{i}" for i in range(100)) if bucket_for(k) != bucket_for("acct-1"))
    refused = cli(
        "enqueue", "hello", "--count", "3", "--ordering-key", "acct-1", "--partition-key", other,
        "--dsn", dsn,
    )  # fmt: skip
    one_line_error(refused, 2, "--partition-key", "give one of them")
    assert jobs_written(dsn) == 3


def test_count_with_a_dedupe_key_is_refused_in_one_line_and_writes_nothing(dsn):
    result = cli("enqueue", "hello", "--count", "5", "--dedupe-key", "k", "--dsn", dsn)
    one_line_error(result, 2, "--dedupe-key", "--count 5", "cannot share a dedupe key")
    assert jobs_written(dsn) == 0


def test_count_copies_get_every_other_option(dsn):
    result = cli(
        "enqueue", "hello", "--count", "4", "--queue", "mail", "--priority", "-3",
        "--max-attempts", "7", "--delay-s", "3600", "--payload", '{"a": 1}', "--dsn", dsn,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = fetchall(
        dsn,
        """SELECT queue_name, priority, max_attempts, payload,
                  run_at > now() + interval '3500 s'
             FROM dispatcher_jobs""",
    )
    assert rows == [("mail", -3, 7, {"a": 1}, True)] * 4


# -- --payload @FILE and - -------------------------------------------------------------------------


def one_mib_payload() -> bytes:
    """Compact JSON of exactly 1 MiB, the default DISPATCHER_MAX_PAYLOAD_BYTES: far over what
    one argument of a command line may hold (128 KiB on Linux)."""
    shell = orjson.dumps({"blob": ""})
    payload = orjson.dumps({"blob": "x" * (MIB - len(shell))})
    assert len(payload) == MIB
    return payload


def test_a_1_mib_payload_is_enqueued_from_a_file_and_from_standard_input(dsn, tmp_path):
    payload = one_mib_payload()
    path = tmp_path / "payload.json"
    path.write_bytes(payload)
    from_file = cli("enqueue", "big", "--payload", f"@{path}", "--dsn", dsn)
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = cli_with_input("enqueue", "big", "--payload", "-", "--dsn", dsn, stdin=payload)
    assert from_stdin.returncode == 0, from_stdin.stderr
    stored = fetchall(
        dsn,
        "SELECT length(payload->>'blob'), payload = %s::jsonb FROM dispatcher_jobs",
        (payload.decode(),),
    )
    assert stored == [(MIB - len(orjson.dumps({"blob": ""})), True)] * 2
    # One byte more is over the limit: refused in one line naming --payload, nothing written.
    over = cli_with_input(
        "enqueue", "big", "--payload", "-", "--dsn", dsn, stdin=payload[:-2] + b'x"}'
    )
    assert over.returncode == 2 and len(over.stderr.splitlines()) == 1, over.stderr
    assert b"--payload" in over.stderr and b"over the limit of 1048576 bytes" in over.stderr
    assert jobs_written(dsn) == 2


def test_bad_json_on_standard_input_is_one_line_and_exit_2(dsn):
    result = cli_with_input("enqueue", "x", "--payload", "-", "--dsn", dsn, stdin=b"{'a': 1}\n")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.decode().splitlines()
    assert line.startswith("dispatcher: invalid setting --payload: not valid JSON (from standard")
    assert jobs_written(dsn) == 0


# -- command groups, lists, labels -----------------------------------------------------------------


def test_limits_and_queues_without_a_subcommand_list(dsn):
    assert cli("limits", "set", "sms", "--max-running", "3", "--dsn", dsn).returncode == 0
    assert cli("queues", "pause", "mail", "--dsn", dsn).returncode == 0
    for group, listed in (("limits", "sms"), ("queues", "mail")):
        bare, explicit = cli(group, "--dsn", dsn), cli(group, "list", "--dsn", dsn)
        assert bare.returncode == 0, bare.stderr
        assert bare.stdout == explicit.stdout and listed in bare.stdout
    assert [r["queue"] for r in orjson.loads(cli("queues", "--json", "--dsn", dsn).stdout)] == [
        "mail"
    ]


def test_limits_set_labels_what_it_set(dsn):
    result = cli("limits", "set", "sms", "--max-running", "10", "--dsn", dsn)
    assert result.stdout.strip() == (
        "limit set: job type 'sms' in every queue: max running 10; 0 running now"
    )
    result = cli(
        "limits", "set", "*", "--queue", "eu", "--per-second", "2.5", "--burst", "5", "--dsn", dsn
    )
    assert result.stdout.strip() == (
        "limit set: every job type in queue 'eu': per second 2.5 (burst 5); 0 running now"
    )


def test_a_list_cut_at_its_limit_says_so_and_its_json_stays_an_array(dsn):
    add(dsn, 4)
    exact = cli("jobs", "list", "--limit", "4", "--dsn", dsn)
    assert exact.returncode == 0 and "note:" not in exact.stdout, exact.stdout
    cut = cli("jobs", "list", "--limit", "3", "--dsn", dsn)
    lines = cut.stdout.splitlines()
    assert len(lines) == 1 + 3 + 1, cut.stdout  # the header, 3 jobs, the note
    assert lines[-1] == (
        "note: showing the newest 3 jobs that match; there are more: raise --limit, or narrow "
        "the filters"
    )
    as_json = cli("jobs", "list", "--limit", "3", "--json", "--dsn", dsn)
    assert len(orjson.loads(as_json.stdout)) == 3
    assert as_json.stderr.startswith("note: showing the newest 3 jobs")
    assert cli("jobs", "list", "--limit", "4", "--json", "--dsn", dsn).stderr == ""


def test_a_jobs_attempt_history_cut_at_100_says_so(dsn):
    (job_id,) = add(dsn, status="failed")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dispatcher_job_attempts
                   (job_id, attempt, worker, started_at, finished_at, duration_ms, outcome)
               SELECT %s, a, 'w', now(), now(), 1.0, 'retried' FROM generate_series(1, 101) a""",
            (job_id,),
        )
    text = cli("jobs", "show", str(job_id), "--dsn", dsn)
    assert "attempts (100):" in text.stdout
    assert text.stdout.splitlines()[-1] == ("note: showing the first 100 attempts; there are more")
    shown = orjson.loads(cli("jobs", "show", str(job_id), "--json", "--dsn", dsn).stdout)
    assert len(shown["attempts"]) == 100 and shown["attempts_truncated"] is True
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM dispatcher_job_attempts WHERE attempt = 101")
    whole = cli("jobs", "show", str(job_id), "--json", "--dsn", dsn)
    assert orjson.loads(whole.stdout)["attempts_truncated"] is False and whole.stderr == ""


# -- admin commands check names as enqueue does ----------------------------------------------------


@pytest.mark.parametrize(
    "command, flag",
    [
        (["queues", "pause", "no such queue!"], "QUEUE"),
        (["queues", "resume", "no such queue!"], "QUEUE"),
        (["limits", "set", "sms", "--queue", "no such queue!", "--max-running", "1"], "--queue"),
        (["limits", "set", "bad type", "--max-running", "1"], "JOB_TYPE"),
        (["limits", "clear", "--queue", "no such queue!"], "--queue"),
        (["jobs", "list", "--queue", "no such queue!"], "--queue"),
        (["jobs", "retry", "--queue", "no such queue!", "--yes"], "--queue"),
        (["schedules", "list", "--queue", "no such queue!"], "--queue"),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else v,
)
def test_admin_commands_refuse_a_name_no_job_can_have(dsn, command, flag):
    version = fetchval(dsn, "SELECT version FROM dispatcher_flow_control")
    line = one_line_error(cli(*command, "--dsn", dsn), 2, flag, "is not a name a job can have")
    assert "\n" not in line
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_paused_queues") == 0
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_limits") == 0
    assert fetchval(dsn, "SELECT version FROM dispatcher_flow_control") == version
