"""The database layer's public face: what tools outside the runtime (bench/) may use of it.

The named queries, the claim statement's text for a mode (for EXPLAIN and to recognise a worker's
claim in pg_stat_activity), the array literals the completion statements take, and migrations.
Everything else in dispatcher/db/ is the runtime's own and may change without notice.
"""

from dispatcher.constants import MODE_PARTITIONED, MODE_SKIP_LOCKED, NUM_BUCKETS
from dispatcher.db.migrate import migrate
from dispatcher.db.queries import query
from dispatcher.db.store import claim_sql, int_array, token_array

__all__ = [
    "MODE_PARTITIONED", "MODE_SKIP_LOCKED", "NUM_BUCKETS", "claim_sql", "int_array", "migrate", "query",
    "token_array",
]
