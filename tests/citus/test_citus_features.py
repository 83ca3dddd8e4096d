"""Features beside the worker's path, proved on a distributed jobs table by their single-node
tests: dedupe keys and uniqueness windows at enqueue (one job, and batches that go job by job on
a cluster), windows closed by a deleting completion, rate limits and held-back gated claims, and
the fleet's status. A selection that keeps the tier's time bounded; each module was run whole on
a cluster when its feature was made to work there (docs/concepts/citus.md lists what does not)."""

from __future__ import annotations

import pytest

# Not yet here: the window tests whose job ends by `jobs cancel`, `jobs purge` or the pruner (those
# statements do not run on a cluster yet: docs/concepts/citus.md).
from tests.integration.test_dedupe_windows import (  # noqa: F401
    test_bulk_enqueue_refuses_duplicates_inside_the_batch_and_against_held_windows,
    test_bulk_enqueue_with_ordering_keys_honours_windows,
    test_concurrent_bulk_enqueues_of_the_same_keys_insert_each_key_once_and_never_deadlock,
    test_enqueuers_racing_the_jobs_completion_never_get_in_within_the_window,
    test_exactly_one_of_many_concurrent_enqueuers_wins_a_free_key_and_an_ended_window,
)
from tests.integration.test_enqueue import test_dedupe_key_holds_for_live_jobs_only  # noqa: F401
from tests.integration.test_flow_control import (  # noqa: F401
    test_a_limit_holds_a_claim_back_only_while_jobs_wait_beyond_it,
    test_a_rate_limit_starts_at_most_its_burst_then_its_rate,
)
from tests.integration.test_status_fleet import *  # noqa: F403


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
