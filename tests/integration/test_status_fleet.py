"""`dispatcher status` shows the live workers, the leader and the bucket owners of each coordination
group, read from the PostgreSQL coordinator's tables while real workers run."""

from __future__ import annotations

import orjson

from dispatcher import Registry
from dispatcher.api.status import read_status, render_status
from dispatcher.serve.worker import Worker
from dispatcher.settings.config import Config
from tests.helpers import run_async, run_worker_until
from tests.integration.test_cli_errors import cli


def test_status_shows_the_workers_the_leader_and_who_owns_which_bucket(dsn):
    worker = Worker(
        Config(dsn=dsn, worker_id="status-w1", poll_interval_s=0.2, coordinator_poll_s=0.2),
        Registry(),
    )

    def owns_everything():
        group = read_status(dsn)["groups"].get("default")
        return group if group and [len(m["buckets"]) for m in group["members"]] == [64] else None

    seen: dict = {}

    def capture():
        group = owns_everything()
        if group:
            seen["group"] = group
            seen["json"] = cli("status", "--json", "--dsn", dsn)
            seen["text"] = cli("status", "--dsn", dsn)
        return group

    run_async(run_worker_until(worker, capture, 30, "the worker to own all 64 buckets"))
    group = seen["group"]
    (member,) = group["members"]
    assert group["leader"] == "status-w1" and group["term"] >= 1
    assert member["id"] == "status-w1" and member["leader"] and not member["leaving"]
    assert member["buckets"] == list(range(64)) and 0 <= member["heartbeat_age_s"] < 30
    assert group["unowned"] == [] and group["orphaned"] == []
    assert seen["json"].returncode == 0, seen["json"].stderr
    listed = orjson.loads(seen["json"].stdout)["groups"]["default"]
    assert [m["id"] for m in listed["members"]] == ["status-w1"] and listed["leader"] == "status-w1"
    text = seen["text"].stdout
    assert "workers of group default: 1 live, leader status-w1" in text, text
    assert any(
        line.split()[:2] == ["status-w1", "(leader)"] and line.endswith("0-63 (64)")
        for line in text.splitlines()
    ), text
    # Once it stopped (it left its group), no live member remains.
    after = read_status(dsn)["groups"]
    assert not [m for g in after.values() for m in g["members"]], after
    assert "workers" in render_status(read_status(dsn))
