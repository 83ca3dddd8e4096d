"""Names and numbers shared by the whole package, in one place."""

import re
from typing import Final

from coordinator import buckets as _buckets

# Every job carries a bucket in [0, NUM_BUCKETS): the coordinator's bucket space (why 64: see
# coordinator/buckets.py). The jobs table CHECKs the same range
# (tests/unit/test_queries.py::test_schema_bucket_check_matches_the_constant keeps the two in step).
NUM_BUCKETS: Final = _buckets.NUM_BUCKETS

NOTIFY_CHANNEL: Final = "dispatcher_jobs"
# Told '<job id>:<status>' when a job someone awaits (JobHandle.result) ends.
RESULTS_CHANNEL: Final = "dispatcher_results"

# What a job does when a parent (depends_on) ends without success: it is cancelled (the default),
# it runs anyway, or it waits for an operator (retry the parent, or cancel the job).
PARENT_FAILURE_POLICIES: Final = ("cancel", "run", "wait")

MODE_PARTITIONED: Final = "partitioned"
MODE_SKIP_LOCKED: Final = "skip_locked"
MODES: Final = (MODE_PARTITIONED, MODE_SKIP_LOCKED)

DEFAULT_QUEUE: Final = "default"

# DISPATCHER_COMPLETED_JOBS: what a successful completion does to the job's row. `archive` moves
# it to the time-partitioned archive in the same fenced statement (dropped by partition after
# DISPATCHER_COMPLETED_RETENTION_S); `keep` marks it completed in place (pruned row by row);
# `delete` deletes it (docs/operations/retention.md says which to choose).
COMPLETED_KEEP: Final = "keep"
COMPLETED_DELETE: Final = "delete"
COMPLETED_ARCHIVE: Final = "archive"
COMPLETED_JOBS: Final = (COMPLETED_KEEP, COMPLETED_DELETE, COMPLETED_ARCHIVE)

# What a queue name or a job type may be: enqueue refuses others, and so does a worker's
# DISPATCHER_QUEUES. No tab, newline or backslash: bulk enqueue writes names into COPY rows as
# they are, and a NOTIFY payload ends the queue name at its last ':'.
NAME_PATTERN: Final = r"[A-Za-z0-9_.\-]{1,100}"
NAME_RE: Final = re.compile(NAME_PATTERN)


def is_valid_name(value: object) -> bool:
    """A queue name or job type that enqueue accepts (a whole-string match: `$` would let a
    trailing newline through)."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


DEFAULT_MAX_ATTEMPTS: Final = 20

# An error on a job's row (last_error, and each entry of `errors`) keeps the head and the tail of
# a traceback (its last line names the exception), bounded so that a chatty exception cannot bloat
# a row that is rewritten on every retry.
LAST_ERROR_MAX_CHARS: Final = 2000
ERROR_CUT_MARK: Final = " [...] "  # stands for what was cut out of the middle

# Every failed attempt's error is kept on its job too (the `errors` column, migration 0015): the
# newest ATTEMPT_ERRORS_KEPT, so a job retried for days keeps a bounded row.
ATTEMPT_ERRORS_KEPT: Final = 20

# The head of the last_error of a job discarded because no worker served its type lately
# (runtime/unserved.py writes it; dispatcher status and the dashboard count by it).
UNSERVED_DISCARD_PREFIX: Final = "discarded: no worker has served"

# Key of the transaction-scoped advisory lock that serialises `dispatcher migrate` across pods
# (arbitrary, fixed forever: changing it would let old and new pods migrate at once).
MIGRATE_LOCK_KEY: Final = 0x6275636B6574  # "bucket"

# A flow-control limit's job type or queue that matches every one (dispatcher limits set '*').
LIMIT_ANY: Final = "*"
