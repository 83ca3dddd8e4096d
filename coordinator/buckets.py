"""The bucket space shared by the job queue and the coordinator."""

from typing import Final

# Every job carries a bucket in [0, NUM_BUCKETS). The jobs table (dispatcher's 0001 migration) and
# the coordinator's bucket table (coordinator/sql/migrations/0002_coordinator.sql) CHECK the same
# range; tests/unit/test_queries.py::test_schema_bucket_check_matches_the_constant and
# tests/integration/test_migrate.py keep them in step. 64 buckets give 16 workers 4 each, and a
# bucket moves as a unit, so more buckets would only add planner branches per claim.
NUM_BUCKETS: Final = 64
