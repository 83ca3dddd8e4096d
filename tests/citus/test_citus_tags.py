"""Tags on a distributed jobs table: the single-node tests of tags (every enqueue path, the filter
of `jobs list` and of the bulk changes, which run bucket by bucket there, and the dashboard's)
run on the cluster."""

from __future__ import annotations

import pytest

from tests.integration.test_tags import *  # noqa: F403
from tests.web.test_tags_page import *  # noqa: F403

# A plan on the coordinator is a distributed scan: the tags index is read on the worker nodes.
del test_a_filter_by_tag_reads_the_tags_index_not_the_table  # noqa: F821


@pytest.fixture
def dsn(citus_dsn: str) -> str:
    return citus_dsn
