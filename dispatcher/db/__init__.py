"""The database layer's public face: what tools outside the runtime (bench/) may use of it.

The named queries, the claim statement's text for a mode (for EXPLAIN and to recognise a worker's
claim in pg_stat_activity), the array literals the completion statements take, migrations and
the placement over a Citus cluster (`distribute`: what `migrate --citus` adds), the values of
DISPATCHER_COMPLETED_JOBS (which completion statement a worker sends), and the completions as a
worker sends them (completion_statements: fenced, under 'delete' and 'archive' closing uniqueness
windows, under 'archive' moving the rows to the archive;
RESULTS_CHANNEL, the channel they notify for awaited jobs).
Everything else in dispatcher/db/ is the runtime's own and may change without notice.
"""

from dispatcher.constants import (
    COMPLETED_ARCHIVE,
    COMPLETED_DELETE,
    COMPLETED_KEEP,
    MODE_PARTITIONED,
    MODE_SKIP_LOCKED,
    NUM_BUCKETS,
    RESULTS_CHANNEL,
)
from dispatcher.db.citus import distribute
from dispatcher.db.claims import claim_sql
from dispatcher.db.completions import completion_statements
from dispatcher.db.literals import int_array, token_array
from dispatcher.db.migrate import migrate
from dispatcher.db.queries import query

__all__ = [
    "COMPLETED_ARCHIVE",
    "COMPLETED_DELETE",
    "COMPLETED_KEEP",
    "MODE_PARTITIONED",
    "MODE_SKIP_LOCKED",
    "NUM_BUCKETS",
    "RESULTS_CHANNEL",
    "claim_sql",
    "completion_statements",
    "distribute",
    "int_array",
    "migrate",
    "query",
    "token_array",
]
