"""The one retry policy: what becomes of a job after an attempt that did not succeed.

Every failed attempt goes through `RetryPolicy.decide`, whoever notices it: the executor (a
handler error, a timeout, an unknown job type, a shutdown interruption) and the reaper (a lease
that expired because the worker died or stalled). So a job that kills its process outright
(`os._exit`, the OOM killer) backs off like any other failure and ends `failed` after
`max_attempts`, instead of being retried at once by every worker in turn.

A handler may bring its own settings (`HandlerRetry`: max_attempts, backoff, a `retry=` callable);
a job's max_attempts given at enqueue still wins. Pure: no I/O, no clock; the random draw is
injectable for tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dispatcher.backoff import MIN_RETRY_DELAY_S, HandlerRetry, is_delay_s, retry_delay_s
from dispatcher.constants import ATTEMPT_ERRORS_KEPT, ERROR_CUT_MARK, LAST_ERROR_MAX_CHARS
from dispatcher.model import (
    STATUS_CANCELLED,
    STATUS_DISCARDED,
    STATUS_FAILED,
    STATUS_QUEUED,
    FailureKind,
    Outcome,
)


class RetryPolicy:
    def __init__(
        self, base_s: float, cap_s: float, rand: Callable[[], float] = random.random
    ) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._rand = rand

    def decide(
        self,
        kind: FailureKind,
        attempts: int,
        max_attempts: int | None,
        error: str,
        retry: HandlerRetry | None = None,
        exc: BaseException | None = None,
    ) -> Outcome:
        """The outcome of attempt number `attempts` (1-based, already counted) of a job allowed
        `max_attempts` (None: not given at enqueue, so the handler's `retry` or the default
        decides), which failed as `kind` with `error` (`exc`, if it raised: for `retry.delay`)."""
        if max_attempts is None:
            max_attempts = (retry or _DEFAULTS).attempts_allowed(None)
        if kind in (FailureKind.CANCELLED, FailureKind.CANCELLED_BY_HANDLER):
            error = cut_error(error)
            # Whatever the attempt: a job someone cancelled must not run again. (The database
            # also turns a retry of a job with a cancel request into 'cancelled': jobs_fail_owned.)
            return Outcome(STATUS_CANCELLED, 0.0, error, max_attempts)
        if kind is FailureKind.PERMANENT:
            return Outcome(STATUS_DISCARDED, 0.0, cut_error(error), max_attempts)
        if kind is FailureKind.UNKNOWN_TYPE or attempts >= max_attempts:
            # Only the in-memory Runner reports a missing handler (in a test, a typo: kept visible
            # as 'failed'). A worker hands such jobs back instead, for a rollout (unserved.py).
            return Outcome(STATUS_FAILED, 0.0, cut_error(error), max_attempts)
        if kind is FailureKind.INTERRUPTED:
            # Not the job's fault: another worker may take it at once (the attempt still counts,
            # since the handler did start).
            return Outcome(STATUS_QUEUED, 0.0, cut_error(error), max_attempts)
        if retry is None:
            return Outcome(
                STATUS_QUEUED,
                retry_delay_s(attempts, self.base_s, self.cap_s, self._rand),
                cut_error(error),
                max_attempts,
            )
        delay_s, error = self._handler_delay_s(retry, attempts, exc, error)
        return Outcome(STATUS_QUEUED, delay_s, cut_error(error), max_attempts)

    def _handler_delay_s(
        self, retry: HandlerRetry, attempts: int, exc: BaseException | None, error: str
    ) -> tuple[float, str]:
        """The handler's delay: its callable's answer if valid, else its (or the worker's)
        backoff. An answer that is not a delay (or a callable that raises) is noted at the head
        of the error."""
        if retry.delay is not None:
            note: str | None
            try:
                chosen = retry.delay(attempts, exc)
            except Exception as raised:
                chosen, note = None, f"retry= raised {type(raised).__name__}: {raised}"
            else:
                note = (
                    None
                    if chosen is None or is_delay_s(chosen)
                    else f"retry= returned {chosen!r}, not seconds"
                )
            if note is None and chosen is not None:
                return max(MIN_RETRY_DELAY_S, float(chosen)), error
            if note is not None:
                error = f"[{note}; the default backoff applied]\n{error}"
        base_s = self.base_s if retry.base_s is None else retry.base_s
        cap_s = max(self.cap_s, base_s) if retry.cap_s is None else retry.cap_s
        return retry_delay_s(attempts, base_s, cap_s, self._rand), error


_DEFAULTS = HandlerRetry()


def lease_expired_error(expiries: int, locked_by: str | None, locked_at: object) -> str:
    """last_error of a job whose lease ran out `expiries` times in all (this one included)."""
    times = "once" if expiries == 1 else f"{expiries} times"
    return (
        f"lease expired {times}: its worker died or stalled "
        f"(last held by {locked_by or '?'} since {locked_at or '?'})"
    )


def cut_error(error: str, limit: int = LAST_ERROR_MAX_CHARS) -> str:
    """`error` in at most `limit` characters: its head and its tail around ERROR_CUT_MARK (the
    tail of a traceback names the exception). jobs_fail_owned cuts by the same rule."""
    if len(error) <= limit:
        return error
    head = (limit - len(ERROR_CUT_MARK)) // 2
    tail = limit - len(ERROR_CUT_MARK) - head
    return f"{error[:head]}{ERROR_CUT_MARK}{error[-tail:]}"


def with_attempt_error(
    errors: list[dict[str, Any]] | None, attempt: int, error: str, at: datetime
) -> list[dict[str, Any]]:
    """A job's `errors` with a failed attempt's appended, as jobs_fail_owned writes them (the
    in-memory store's copy of that rule): the newest ATTEMPT_ERRORS_KEPT, each cut by cut_error."""
    entry = {"attempt": attempt, "at": at.isoformat(), "error": cut_error(error)}
    return [*(errors or [])[-(ATTEMPT_ERRORS_KEPT - 1) :], entry]
