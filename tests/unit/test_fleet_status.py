"""How `dispatcher status` shows the fleet (dispatcher/api/fleet_status.py): bucket ranges, and the
text of each group's workers, leader, hand-offs and buckets without a live owner."""

from __future__ import annotations

from dispatcher.api.fleet_status import render_fleet, render_registry
from dispatcher.api.text import bucket_ranges
from dispatcher.settings.meta import parse_buckets


def test_bucket_ranges():
    assert bucket_ranges([5, 0, 1, 2, 8, 7]) == "0-2,5,7-8"
    assert bucket_ranges(range(64)) == "0-63"
    assert bucket_ranges([]) == "none"


def test_a_group_shows_each_member_with_its_buckets_the_leader_and_what_moves():
    groups = {
        "default": {
            "leader": "w1",
            "term": 3,
            "members": [
                {
                    "id": "w1",
                    "heartbeat_age_s": 0.4,
                    "up_s": 3725.0,
                    "leaving": False,
                    "leader": True,
                    "buckets": list(range(32)),
                },
                {
                    "id": "w2",
                    "heartbeat_age_s": 1.25,
                    "up_s": 42.0,
                    "leaving": True,
                    "leader": False,
                    "buckets": list(range(32, 62)),
                },
            ],
            "unowned": [63],
            "handoffs": [{"bucket": 40, "from": "w2", "to": "w1"}],
            "orphaned": [{"bucket": 62, "owner": "w9"}],
        }
    }
    lines = render_fleet(groups)
    assert lines[0] == "workers of group default: 2 live, leader w1 (term 3)"
    assert lines[2].split() == ["w1", "(leader)", "0.4s", "1h02m", "0-31", "(32)"]
    assert lines[3].split() == ["w2", "(leaving)", "1.2s", "42s", "32-61", "(30)"]
    assert lines[4] == "  hand-offs in progress: 40 w2 -> w1"
    assert lines[5] == "  buckets of members no longer live: 62 (w9)"
    assert lines[6] == "  buckets without an owner: 63"


def test_no_members_says_why_there_may_be_none():
    (line,) = render_fleet({})
    assert "Redis or static" in line


def test_bucket_ranges_are_what_the_buckets_setting_reads():
    for buckets in ([0], [1, 2, 3, 9], list(range(64)), [0, 2, 4, 63], [10, 11, 40, 41, 42]):
        assert parse_buckets(bucket_ranges(buckets)) == tuple(buckets)


def test_the_registry_shows_a_line_of_counts_then_a_column_per_field_of_each_live_worker():
    live = [
        {
            "id": "pod-a-12-abcdef",
            "host": "pod-a",
            "pid": 12,
            "version": "0.9.0",
            "mode": "partitioned",
            "coordinator": "postgres",
            "queues": ["default", "mail"],
            "running": 3,
            "concurrency": 100,
            "up_s": 3725.0,
            "heartbeat_age_s": 0.42,
        },
        {
            "id": "w2",
            "host": "pod-b",
            "pid": 12345,
            "version": "0.9.0",
            "mode": "skip_locked",
            "coordinator": "none",
            "queues": ["default"],
            "running": 0,
            "concurrency": 20,
            "up_s": 42.0,
            "heartbeat_age_s": 1.9,
        },
    ]
    lines = render_registry(live, gone=3, vanished=1)
    assert lines[0].startswith("workers: 2 live ")
    assert "3 gone within the hour (2 stopped, 1 lease ran out" in lines[0]
    assert lines[1].split()[0] == "worker" and lines[1].split()[-1] == "heartbeat"
    assert lines[2].split() == [
        "pod-a-12-abcdef",
        "pod-a",
        "12",
        "0.9.0",
        "partitioned",
        "postgres",
        "default,mail",
        "3/100",
        "1h02m",
        "0.4s",
    ]
    assert lines[3].split() == [
        "w2",
        "pod-b",
        "12345",
        "0.9.0",
        "skip_locked",
        "none",
        "default",
        "0/20",
        "42s",
        "1.9s",
    ]
    # columns line up: each row's cells start where the header's do
    assert lines[2].index("partitioned") == lines[3].index("skip_locked") == lines[1].index("mode")
    assert render_registry([], gone=0, vanished=0) == [
        "workers: 0 live (the worker registry: every mode and coordinator)"
    ]
