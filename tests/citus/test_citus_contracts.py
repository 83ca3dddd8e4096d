"""The snooze, ordering-key, attempt-error and progress contracts of the store (tests/contract) on
a distributed jobs table: a snooze, its cap, a cancel request, a keyed job's key held and handed on,
every failed attempt's error kept on its row, handlers' progress fenced, each write routed to
its job's bucket (one test stays on one node: below). The store contract suite itself:
test_citus_store_contract.py, whose fixtures these share."""

from __future__ import annotations

from tests.citus.test_citus_store_contract import dsn, on_store, on_store_completing
from tests.contract import (
    test_attempt_errors_contract,
    test_ordering_contract,
    test_progress_contract,
    test_snooze_contract,
)

__all__ = ["dsn", "on_store", "on_store_completing"]  # fixtures, used by name

# The modules export their fixtures only (`__all__`): their tests are taken by name.
for _module in (
    test_snooze_contract,
    test_ordering_contract,
    test_attempt_errors_contract,
    test_progress_contract,
):
    globals().update({n: f for n, f in vars(_module).items() if n.startswith("test_")})

# It orders two keys' jobs by priority across their buckets, and claims again right after a keyed
# completion without the NOTIFY a worker's listener turns into a wake-up: a cluster claims bucket
# by bucket and skips a bucket found empty until woken. Per-key order on a cluster:
# test_citus_cluster.py::test_ordering_keys_hold_on_a_distributed_table.
del test_a_keys_jobs_are_claimable_one_at_a_time_in_id_order_under_either_completion  # noqa: F821
