"""The operator's writes on a distributed jobs table: the single-node tests of `jobs retry`,
`cancel` and `purge` (API and CLI), of their effect on ordering keys, of cancelling, of the
uniqueness windows such an end leaves, and of searches (payload, error text, ids), run on the
cluster, where each write goes bucket by bucket (dispatcher/db/sharded_admin.py). Left on one
node, each for a reason of the cluster's own:"""

from __future__ import annotations

import pytest

from tests.integration.test_admin import *  # noqa: F403
from tests.integration.test_admin_cli import *  # noqa: F403
from tests.integration.test_cancel import *  # noqa: F403
from tests.integration.test_dedupe_windows import (  # noqa: F401
    test_a_duplicate_is_refused_while_live_and_within_the_window_after_the_job_ended,
    test_the_window_counts_from_when_the_job_finished_and_a_duplicate_goes_in_once_it_passed,
)
from tests.integration.test_job_search import *  # noqa: F403
from tests.integration.test_ordering_admin import *  # noqa: F403

# It waits for the retry's row lock in pg_stat_activity of the node it connects to; on a cluster
# the retry waits on the worker node that holds the row.
del test_a_job_that_changes_while_a_retry_waits_for_its_row_is_skipped_not_overwritten  # noqa: F821
# Its failed job's dedupe key did not pick its bucket (the test places the job by hand): on a
# cluster a dedupe key is unique within its bucket, so another bucket's live job does not hold it.
del test_a_retry_counts_waiting_jobs_as_live_for_dedupe_keys  # noqa: F821


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
