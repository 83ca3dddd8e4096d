"""The coordinator's own exceptions. Driver errors (psycopg, redis) become these at the backend
boundary, by one rule: what waiting may fix (the backend cannot be reached, a statement timed out:
pg/errors.py classifies PostgreSQL's) -> CoordinatorUnavailable; anything else the driver raises
-> CoordinatorError. Callers never see a raw driver exception."""


class CoordinatorError(Exception):
    """Base class of every error the coordinator raises on purpose."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordination backend cannot be reached right now (connection refused or lost, timeout,
    a read-only replica); retry later."""


class NotLeader(CoordinatorError):
    """A leader-only write was refused: leadership was lost (or never held)."""
