"""The store contract suite (tests/contract/test_store_contract.py) on a distributed jobs table:
the same port, the same outcomes, with each write routed to its job's bucket. Four tests stay on
one node, for what a cluster changes on purpose (docs/concepts/citus.md)."""

from __future__ import annotations

import pytest

from tests.contract.test_store_contract import *  # noqa: F403
from tests.contract.test_store_contract import Run, _runner

# A cluster claims bucket by bucket: priority and run_at order hold within a bucket, not across.
del test_claims_come_in_priority_then_run_at_then_id_order  # noqa: F821
# It picks the job to finish by priority across buckets (cancel is tested in test_citus_admin).
del test_cancel_ends_a_queued_job_and_asks_a_running_one_which_then_is_never_retried  # noqa: F821
# Stealing is off on a cluster: a steal claims nothing.
del test_a_steal_takes_from_the_tail_of_each_bucket_beyond_its_reserve_in_the_order_given  # noqa: F821
# Claim windows have no veto there (claims go bucket by bucket): priority holds within a bucket.
del test_a_claim_window_takes_nothing_while_another_bucket_of_the_claimer_has_a_better_job  # noqa: F821


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn


@pytest.fixture(params=["postgres"])
def on_store(request: pytest.FixtureRequest) -> Run:
    """The PostgreSQL harness only (the in-memory store has no cluster)."""
    return _runner(request, "keep")


@pytest.fixture(params=[("postgres", "keep"), ("postgres", "delete")], ids="-".join)
def on_store_completing(request: pytest.FixtureRequest) -> Run:
    return _runner(request, request.param[1], kind=request.param[0])
