"""SIGTERM while the PostgreSQL coordinator's connection is stalled (a proxy that stops forwarding):
leaving the group cannot reach the database. The worker must say so in one line with a reason,
leave no abandoned task behind ("Task exception was never retrieved"), and still exit within its
bound, leaving its lease to expire."""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.chaos.support import enqueue, started_by
from tests.helpers import wait_until

pytestmark = pytest.mark.chaos

OPTS = dict(
    lease_s=4.0,
    coordinator_lease_s=3,
    coordinator_poll_s=0.5,
    retry_base_s=0.05,
    shutdown_grace_s=2.0,
)


def test_sigterm_during_a_stall_says_why_it_could_not_leave_and_abandons_no_task(
    chaos_dsn, proxy_to, workers
):
    proxy = proxy_to(chaos_dsn)
    stalled = workers.start(proxy.dsn_via(chaos_dsn), "s", concurrency=5, **OPTS)
    stalled.wait_for_log(r"worker s running", 30)
    stalled.wait_for_log(r"rebalance by s over 1 members", 30)
    enqueue(chaos_dsn, "record_slow", 5, {"s": 1.0})
    wait_until(
        lambda: len(started_by(workers.executions(), stalled.pid)) == 5, 30, "s runs all 5 jobs"
    )
    proxy.blackhole()
    # The coordinator notices (its heartbeat has no answer) and drops its connection: leaving must
    # connect anew.
    stalled.wait_for_log(r"coordinator backend (unreachable|failed)", 30)
    sent = stalled.signal(signal.SIGTERM)
    code = stalled.exited_within(stalled.shutdown_bound_s, sent)
    exited_s = time.monotonic() - sent
    log = stalled.log_text()
    assert code == 1, log[-3000:]
    leave = re.findall(r"could not leave cleanly \((.*)\): our lease will expire instead", log)
    assert leave and all(reason.strip() for reason in leave), log[-3000:]
    assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]
    print(f"\nexited {exited_s:.1f} s after SIGTERM; could not leave: {leave[0]}")
