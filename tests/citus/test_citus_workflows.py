"""Composing work on a distributed jobs table: results stored with their jobs and awaited (the
results contract, tests/contract/test_results_contract.py), and graphs (workflows, batches,
depends_on) refused with a clear error, nothing written: a cluster's completion is routed bucket by
bucket and does not release children yet (docs/concepts/workflows.md)."""

from __future__ import annotations

import psycopg
import pytest

from dispatcher import (
    EnqueueError,
    JobSpec,
    Workflow,
    enqueue_batch_sync,
    enqueue_sync,
    enqueue_workflow_sync,
)
from tests.citus.test_citus_store_contract import dsn, on_store, on_store_completing
from tests.contract import test_results_contract
from tests.helpers import fetchval

__all__ = ["dsn", "on_store", "on_store_completing"]  # fixtures, used by name

globals().update({n: f for n, f in vars(test_results_contract).items() if n.startswith("test_")})

# Under DISPATCHER_COMPLETED_JOBS=delete a cluster's completion deletes a job with a result too
# (its per-bucket statements do not keep it): there a result is kept under `keep` only.
del test_a_result_is_stored_with_its_job_and_kept_whatever_completed_jobs_says  # noqa: F821


def test_graphs_are_refused_on_a_cluster_and_nothing_is_written(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        parent = enqueue_sync(conn, "a")
        assert parent is not None
        with pytest.raises(EnqueueError, match="not available on a Citus cluster") as refused:
            enqueue_sync(conn, "b", depends_on=[parent])
        assert refused.value.option == "depends_on"
        wf = Workflow()
        wf.add("x", "a")
        wf.add("y", "b", after=["x"])
        with pytest.raises(EnqueueError, match="not available on a Citus cluster"):
            enqueue_workflow_sync(conn, wf)
        with pytest.raises(EnqueueError, match="not available on a Citus cluster"):
            enqueue_batch_sync(conn, [JobSpec("a")], JobSpec("report"))
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 1
