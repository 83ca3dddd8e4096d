"""A worker killed with SIGKILL leaves the worker registry's live view (`dispatcher status`) within
its registry lease, without anybody taking it out: its last heartbeat's lease runs out. A worker
beside it stays live, and the dead one is counted as gone without a clean stop."""

from __future__ import annotations

import time

import pytest

from dispatcher.api.status import read_status
from dispatcher.runtime.presence import INTERVAL_S, LEASE_INTERVALS
from tests.helpers import wait_until

pytestmark = pytest.mark.chaos

LEASE_S = INTERVAL_S * LEASE_INTERVALS  # 6 s: a killed worker is live at most this long after
# A loaded 2-core machine: the last beat's statement, the status reads and the poll's own delay.
MARGIN_S = 5.0


def live_ids(dsn: str) -> set[str]:
    return {w["id"] for w in read_status(dsn)["workers"]}


def test_a_worker_killed_9_leaves_the_live_view_within_its_lease(chaos_dsn, workers):
    victim = workers.start(chaos_dsn, "reg-victim", mode="partitioned")
    survivor = workers.start(chaos_dsn, "reg-survivor", mode="skip_locked")
    for worker in (victim, survivor):
        worker.wait_for_log(rf"worker {worker.name} running", 30)
    wait_until(
        lambda: live_ids(chaos_dsn) == {"reg-victim", "reg-survivor"},
        15,
        lambda: f"both workers live in the registry:\n{workers.log_tails()}",
    )

    victim.kill()
    killed_at = time.monotonic()
    wait_until(
        lambda: "reg-victim" not in live_ids(chaos_dsn),
        LEASE_S + MARGIN_S,
        lambda: f"the killed worker out of the live view within {LEASE_S + MARGIN_S:g} s",
        interval_s=0.1,
    )
    took_s = time.monotonic() - killed_at
    print(f"the killed worker left the live view {took_s:.2f} s after the kill (lease {LEASE_S} s)")

    status = read_status(chaos_dsn)
    assert [w["id"] for w in status["workers"]] == ["reg-survivor"], status["workers"]
    assert status["workers"][0]["mode"] == "skip_locked"
    # Gone without a clean stop: its lease ran out, nobody wrote that it stopped.
    assert (status["workers_gone"], status["workers_vanished"]) == (1, 1)
    assert survivor.stop() == 0
    after = read_status(chaos_dsn)
    assert after["workers"] == [] and (after["workers_gone"], after["workers_vanished"]) == (2, 1)
