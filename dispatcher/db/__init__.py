"""The database layer's public face: what tools outside the runtime (bench/) may use of it.

The named queries, the claim statement's text for a mode (for EXPLAIN and to recognise a worker's
claim in pg_stat_activity), the array literals the completion statements take, migrations, the
values of DISPATCHER_COMPLETED_JOBS (which completion statement a worker sends), and the completions
as a worker sends them under 'delete' (closing_completions: they close uniqueness windows).
Everything else in dispatcher/db/ is the runtime's own and may change without notice.
"""

from dispatcher.constants import COMPLETED_DELETE, COMPLETED_KEEP, MODE_PARTITIONED, MODE_SKIP_LOCKED, NUM_BUCKETS
from dispatcher.db.migrate import migrate
from dispatcher.db.queries import query
from dispatcher.db.store import claim_sql, closing_completions, int_array, token_array

__all__ = [
    "COMPLETED_DELETE", "COMPLETED_KEEP", "MODE_PARTITIONED", "MODE_SKIP_LOCKED", "NUM_BUCKETS", "claim_sql",
    "closing_completions", "int_array", "migrate", "query",
    "token_array",
]
