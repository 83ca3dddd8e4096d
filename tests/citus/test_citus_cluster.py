"""The jobs table on a real Citus cluster: `dispatcher migrate --citus` places it, one shard per
bucket; every statement a worker runs for one bucket is a router query on one node; workers drain
it in both modes, each job once."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import psycopg
import pytest

from dispatcher import Config, Job, Registry, Worker, enqueue_payloads_sync, enqueue_sync
from dispatcher.api.flow import list_limits, pause_queue, set_limit
from dispatcher.cli.commands import main as cli_main
from dispatcher.db.citus import distribute
from dispatcher.db.migrate import migrate
from dispatcher.db.queries import query
from dispatcher.db.rows import TypeFilter
from dispatcher.db.sharded import claim_text, keyed_completion_text, pinned
from dispatcher.errors import MigrationError
from tests.helpers import fetchall, fetchval, run_async, run_worker_until, status_counts

TOKENS = [str(uuid.uuid4()), str(uuid.uuid4())]


def _tasks(conn: psycopg.Connection, sql: str, params: dict) -> int:
    """How many tasks Citus splits `sql` into (1: a router query on one node)."""
    plan = [r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall()]
    counts = [line.split(":")[1].strip() for line in plan if "Task Count:" in line]
    assert counts, "\n".join(plan)
    return max(int(c) for c in counts)


PLACEMENT = """
SELECT (SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'dispatcher_jobs'::regclass),
       (SELECT count(DISTINCT get_shard_id_for_distribution_column('dispatcher_jobs', b::smallint))
          FROM generate_series(0, 63) AS b),
       (SELECT count(DISTINCT n.nodeid)
          FROM pg_dist_placement AS p JOIN pg_dist_shard AS s USING (shardid)
          JOIN pg_dist_node AS n ON n.groupid = p.groupid
         WHERE s.logicalrelid = 'dispatcher_jobs'::regclass)
"""


def _placement(dsn: str) -> tuple[int, int, int]:
    """(shards of the jobs table, distinct shards the 64 buckets map to, nodes holding them)."""
    return fetchall(dsn, PLACEMENT)[0]


def test_migrate_citus_without_the_extension_fails_with_one_line(dsn, capsys):
    with pytest.raises(MigrationError, match="needs the citus extension"):
        distribute(dsn)
    assert cli_main(["migrate", "--citus", "--dsn", dsn]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "citus extension" in err[0], err
    # nothing changed for the single-node install: it still works as one
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0


def test_distributing_a_table_that_holds_jobs_keeps_every_job_one_bucket_a_shard(
    citus_empty_dsn,
):
    dsn = citus_empty_dsn
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{"n": i} for i in range(640)])
    before = fetchall(dsn, "SELECT id, bucket FROM dispatcher_jobs ORDER BY id")
    placed = distribute(dsn)
    assert any("distributed by bucket" in step for step in placed), placed
    assert _placement(dsn) == (64, 64, 2)
    assert distribute(dsn) == []  # idempotent
    assert fetchall(dsn, "SELECT id, bucket FROM dispatcher_jobs ORDER BY id") == before
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{"n": i} for i in range(10)])
    after = fetchall(dsn, "SELECT id FROM dispatcher_jobs ORDER BY id")
    assert len({r[0] for r in after}) == 650 and after[-1][0] > before[-1][0]  # ids stay unique
    for table in ("dispatcher_flow_control", "dispatcher_limits", "dispatcher_paused_queues"):
        kind = fetchval(
            dsn,
            "SELECT repmodel FROM pg_dist_partition WHERE logicalrelid = %s::regclass",
            (table,),
        )
        assert kind == "t", table  # reference tables: a claim reads them on any node


def test_every_per_bucket_statement_is_a_router_query(citus_dsn):
    ids = {"ids": [1, 2], "tokens": TOKENS, "bucket": 7}
    claim = {
        "queue": "default",
        "limit": 10,
        "lease_s": 30.0,
        "worker": "w",
        "token": TOKENS[0],
        "flow_version": 3,
        "bucket": 7,
        "claim_types": ["a"],
    }
    fail = {
        **ids,
        "statuses": ["queued", "failed"],
        "delays_s": [1.0, 0.0],
        "errors": ["e", "e"],
        "halts": [True, True],
        "snoozes_s": [None, None],
        "snooze_caps": [None, None],
        "lease_expired": True,
        "channel": "c",
        "errors_kept": 20,
        "error_chars": 2000,
        "results_channel": "c",
    }
    complete = {"keep": query("jobs_complete_owned"), "delete": query("jobs_complete_owned_delete")}
    slot = {
        "queue": "default",
        "job_type": "t",
        "payload": None,
        "priority": 0,
        "bucket": 7,
        "max_attempts": None,
        "slot_at": datetime(2026, 11, 29, tzinfo=UTC),
        "name": "s",
        "channel": "c",
        "notify": "default:7",
    }
    statements = {
        "claim partitioned": (claim_text(None, skip_locked=False), claim),
        "claim skip_locked": (claim_text(None, skip_locked=True), claim),
        "claim of some types": (claim_text(TypeFilter(("a",), True), skip_locked=False), claim),
        "claim but some types": (claim_text(TypeFilter(("a",), False), skip_locked=True), claim),
        "next due": (query("jobs_next_due_in_bucket"), {"queue": "default", "bucket": 7}),
        "lease scan": (query("jobs_lease_expired_bucket"), {"bucket": 7, "limit": 100}),
        "completion": (
            pinned(query("sharded_complete_fenced").replace("{completion}", complete["keep"])),
            ids,
        ),
        "completion, delete": (
            pinned(query("sharded_complete_fenced").replace("{completion}", complete["delete"])),
            ids,
        ),
        "keyed completion": (keyed_completion_text(query("jobs_complete_owned")), ids),
        "keyed completion, delete": (
            keyed_completion_text(query("jobs_complete_owned_delete")),
            ids,
        ),
        "ordering sweep": (
            query("ordering_promote_scan_bucket").replace(
                "{promote}", query("sharded_promote_next")
            ),
            {"queue": "default", "after": "", "limit": 100, "bucket": 7},
        ),
        "failure": (pinned(query("jobs_fail_owned")), fail),
        "release": (pinned(query("jobs_release_owned")), {**ids, "channel": "c"}),
        "hand-back of a job without a handler": (
            pinned(query("jobs_hand_back_owned")),
            {
                **ids,
                "delays_s": [2.0, 2.0],
                "unserved": [False, True],
                "errors": ["e", "e"],
                "window_s": 3600.0,
                "channel": "c",
            },
        ),
        "lease extension": (pinned(query("jobs_extend_leases")), {**ids, "lease_s": 30.0}),
        "schedule round's enqueue of a slot": (query("schedule_enqueue_slot"), slot),
    }
    with psycopg.connect(citus_dsn, autocommit=True) as conn:
        tasks = {name: _tasks(conn, sql, params) for name, (sql, params) in statements.items()}
    assert tasks == dict.fromkeys(statements, 1)


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_workers_drain_a_distributed_table_each_job_once(citus_dsn, mode):
    registry = Registry()
    seen: list[int] = []

    @registry.handler("a")
    async def a(job: Job) -> None:
        seen.append(job.id)
        if job.payload["n"] % 7 == 0:
            raise RuntimeError("fails once, then retried")  # the failure path, bucket by bucket

    with psycopg.connect(citus_dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{"n": i} for i in range(1500)], max_attempts=2)
    config = Config(
        dsn=citus_dsn,
        mode=mode,
        concurrency=40,
        batch_size=100,
        poll_interval_s=0.1,
        flush_interval_s=0.01,
        reaper_interval_s=0.5,
        retry_base_s=0.05,
        retry_cap_s=0.1,
    ).replace()
    worker = Worker(config, registry)

    def finished() -> bool:
        counts = status_counts(citus_dsn)
        return counts.get("completed", 0) + counts.get("failed", 0) >= 1500

    run_async(run_worker_until(worker, finished, 120, "1500 jobs finished"))
    failing = sum(1 for i in range(1500) if i % 7 == 0)
    assert status_counts(citus_dsn) == {"completed": 1500 - failing, "failed": failing}
    assert len(seen) == 1500 + failing  # each failing job ran twice, every other job once
    assert (
        fetchval(citus_dsn, "SELECT count(*) FROM dispatcher_jobs WHERE lock_token IS NOT NULL")
        == 0
    )


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_ordering_keys_hold_on_a_distributed_table(citus_dsn, mode):
    """Jobs that share a key run one at a time in enqueue order; each key's next job is promoted
    in its own bucket's shard, and its owner woken from the coordinator node."""
    registry = Registry()
    running: set[str] = set()
    overlaps: list[str] = []
    order: dict[str, list[int]] = {}

    @registry.handler("k")
    async def k(job: Job) -> None:
        key = job.payload["key"]
        if key in running:
            overlaps.append(key)
        running.add(key)
        await asyncio.sleep(0.002)
        order.setdefault(key, []).append(job.payload["seq"])
        running.discard(key)

    keys = [f"acct-{n}" for n in range(24)]
    with psycopg.connect(citus_dsn, autocommit=True) as conn:
        # One at a time: the bulk path with ordering keys does not run on a cluster yet.
        for seq in range(15):
            for key in keys:
                enqueue_sync(conn, "k", {"key": key, "seq": seq}, ordering_key=key)
    config = Config(
        dsn=citus_dsn,
        mode=mode,
        concurrency=20,
        batch_size=50,
        poll_interval_s=0.5,
        flush_interval_s=0.01,
    ).replace()
    worker = Worker(config, registry)
    total = len(keys) * 15

    def finished() -> bool:
        return status_counts(citus_dsn).get("completed", 0) >= total

    run_async(run_worker_until(worker, finished, 120, f"{total} keyed jobs finished"))
    assert overlaps == []
    assert order == {key: list(range(15)) for key in keys}
    assert status_counts(citus_dsn) == {"completed": total}


def test_fleet_limits_and_pauses_hold_on_a_distributed_table(citus_dsn):
    """A gated claim counts the running jobs over every shard and claims bucket by bucket inside
    its transaction: a max_running of 3 is never exceeded. A paused queue runs nothing."""
    registry = Registry()
    running: list[int] = []
    peak: list[int] = [0]

    @registry.handler("sms")
    async def sms(job: Job) -> None:
        running.append(job.id)
        peak[0] = max(peak[0], len(running))
        await asyncio.sleep(0.01)
        running.remove(job.id)

    row = set_limit(citus_dsn, "sms", max_running=3)
    assert (row.max_running, row.running) == (3, 0)
    assert pause_queue(citus_dsn, "paused")
    with psycopg.connect(citus_dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "sms", [{}] * 60)
        enqueue_payloads_sync(conn, "sms", [{}] * 20, queue="paused")
    config = Config(
        dsn=citus_dsn,
        queues=("default", "paused"),
        concurrency=20,
        poll_interval_s=0.1,
        flush_interval_s=0.01,
    ).replace()

    def finished() -> bool:
        return status_counts(citus_dsn).get("completed", 0) >= 60

    run_async(run_worker_until(Worker(config, registry), finished, 120, "60 limited jobs"))
    assert peak[0] == 3  # the limit held, and was reached
    assert fetchall(
        citus_dsn,
        "SELECT queue_name, status, count(*) FROM dispatcher_jobs GROUP BY 1, 2 ORDER BY 1",
    ) == [("default", "completed", 60), ("paused", "queued", 20)]
    assert [(r.job_type, r.running) for r in list_limits(citus_dsn)] == [("sms", 0)]


def test_statements_beside_the_coordinator_nodes_tables_read_only_the_jobs_they_name(citus_dsn):
    """A statement that reads a table of the coordinator node (uniqueness windows, schedule runs)
    with the jobs of its rows reads those jobs by id on each shard: as a join, Citus pulled every
    job of every shard to the coordinator node, at every windowed enqueue and schedule round."""
    statements = {
        "window check at enqueue": (query("dedupe_key_lock"), {"queue": "q", "dedupe_key": "k"}),
        "windows' pruning": (query("dedupe_windows_prune"), {"limit": 100}),
        "schedule round's settling": (
            query("schedule_runs_settle"),
            {"names": ["s"], "gone": "gone"},
        ),
        "schedules list": (query("schedules_list"), {"queue": None}),
    }
    with psycopg.connect(citus_dsn, autocommit=True) as conn:
        for name, (sql, params) in statements.items():
            plan = [r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall()]
            scans = [
                plan[i] + plan[i + 1]
                for i, line in enumerate(plan)
                if " on dispatcher_jobs_" in line
            ]
            assert scans, (name, "\n".join(plan))
            for scan in scans:  # through an index, or filtered by the ids it names
                assert "Index" in scan or "id = ANY" in scan, (name, "\n".join(plan))
