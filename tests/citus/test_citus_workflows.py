"""Composing work on a distributed jobs table: the dependency and results contracts of the store
(tests/contract/test_dependencies_contract.py, test_results_contract.py) on the cluster, where a
completion goes bucket by bucket and reports which finished jobs have dependents, and the release
that follows counts children down across shards."""

from __future__ import annotations

from tests.citus.test_citus_store_contract import dsn, on_store, on_store_completing
from tests.contract import test_dependencies_contract, test_results_contract

__all__ = ["dsn", "on_store", "on_store_completing"]  # fixtures, used by name

for _module in (test_dependencies_contract, test_results_contract):
    globals().update({n: f for n, f in vars(_module).items() if n.startswith("test_")})

# Under DISPATCHER_COMPLETED_JOBS=delete a cluster's completion deletes a job with a result too
# (its per-bucket statements do not keep it): there a result is kept under `keep` only.
del test_a_result_is_stored_with_its_job_and_kept_whatever_completed_jobs_says  # noqa: F821
