"""The one retry policy: what becomes of a job after an attempt that did not succeed.

Every failed attempt goes through `RetryPolicy.decide`, whoever notices it: the executor (a
handler error, a timeout, an unknown job type, a shutdown interruption) and the reaper (a lease
that expired because the worker died or stalled). So a job that kills its process outright
(`os._exit`, the OOM killer) backs off like any other failure and ends `failed` after
`max_attempts`, instead of being retried at once by every worker in turn.

Pure: no I/O, no clock; the random draw is injectable for tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dispatcher.backoff import retry_delay_s
from dispatcher.constants import LAST_ERROR_MAX_CHARS
from dispatcher.model import STATUS_CANCELLED, STATUS_DISCARDED, STATUS_FAILED, STATUS_QUEUED, FailureKind, Outcome


class RetryPolicy:
    def __init__(self, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._rand = rand

    def decide(self, kind: FailureKind, attempts: int, max_attempts: int, error: str) -> Outcome:
        """The outcome of attempt number `attempts` (1-based, already counted) of a job allowed
        `max_attempts`, which failed as `kind` with `error`."""
        error = error[:LAST_ERROR_MAX_CHARS]
        if kind is FailureKind.CANCELLED:
            # Whatever the attempt: a job someone cancelled must not run again. (The database
            # also turns a retry of a job with a cancel request into 'cancelled': jobs_fail_owned.)
            return Outcome(STATUS_CANCELLED, 0.0, error)
        if kind is FailureKind.PERMANENT:
            return Outcome(STATUS_DISCARDED, 0.0, error)
        if kind is FailureKind.UNKNOWN_TYPE or attempts >= max_attempts:
            # A missing handler does not appear by waiting: retrying every few seconds would only
            # be a storm of pointless claims. Kept visible as 'failed'.
            return Outcome(STATUS_FAILED, 0.0, error)
        if kind is FailureKind.INTERRUPTED:
            # Not the job's fault: another worker may take it at once (the attempt still counts,
            # since the handler did start).
            return Outcome(STATUS_QUEUED, 0.0, error)
        return Outcome(STATUS_QUEUED, retry_delay_s(attempts, self.base_s, self.cap_s, self._rand), error)


def lease_expired_error(expiries: int, locked_by: str | None, locked_at: object) -> str:
    """last_error of a job whose lease ran out `expiries` times in all (this one included)."""
    times = "once" if expiries == 1 else f"{expiries} times"
    return (f"lease expired {times}: its worker died or stalled "
            f"(last held by {locked_by or '?'} since {locked_at or '?'})")
