"""The package's own exceptions. Driver errors (psycopg, redis) are turned into these at the
store boundary."""


class DispatcherError(Exception):
    """Base class for every error this package raises on purpose."""


class ConfigError(DispatcherError):
    """A setting is invalid. `setting` names it the way the user wrote it (env var or flag)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


class PayloadError(DispatcherError, ValueError):
    """A payload cannot be serialised or is over the size limit; nothing was written."""


class ProgressError(DispatcherError, ValueError):
    """A handler reported a progress value or metadata that cannot be stored (`Job.set_progress`,
    `Job.update_meta`): not JSON, not a dict of string keys, or over its size limit (8 KiB as
    JSON). Raised in the handler's call; nothing of that call was recorded."""


class EnqueueError(DispatcherError, ValueError):
    """An enqueue option is invalid (unknown bucket, negative delay, ...); nothing was written.
    `option` names it as enqueue's keyword argument (`delay_s`), when one option is at fault."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class AdminInputError(DispatcherError, ValueError):
    """A bad filter or argument of dispatcher.admin; nothing was read or written. `option` names
    it (a Filters field)."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


class StoreError(DispatcherError):
    """The database refused or failed a statement."""


class StoreUnavailable(StoreError):
    """The database cannot be reached right now (connection lost, server shutting down); retry
    later."""


class StoreTimeout(StoreUnavailable):
    """A statement gave up: it waited past lock_timeout for a lock (`lock` true) or ran past
    statement_timeout. Retrying may work once whatever held the lock or loaded the server is
    done."""

    def __init__(self, message: str, *, lock: bool) -> None:
        super().__init__(message)
        self.lock = lock


class StoreConflict(StoreError):
    """A statement would have broken a uniqueness rule of the jobs table (SQLSTATE 23505): two
    jobs holding one ordering key, or one dedupe key. Statements are written so that this only
    happens when two promotions of one key race; the loser changes nothing and may try again."""


class StoreRefused(StoreError):
    """Connecting cannot work as configured: the server refused the login (role, database,
    password, pg_hba), or a connection setting is wrong (libpq refuses it, or the server cannot
    meet its SSL requirement). Retrying will not help; the message says which."""


class SchemaMissing(StoreError):
    """One of the dispatcher's tables does not exist: the schema was never migrated here (or the
    DSN names another database). The message says to run `dispatcher migrate`."""


class StorePermissionDenied(StoreError):
    """The database role lacks a privilege for a statement (retrying will not help). `reason` and
    `hint` are the server's message and hint (what to grant), without our statement label."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.hint = hint


class MigrationError(StoreError):
    """The schema could not be brought up to date."""


class PermanentJobError(DispatcherError):
    """Raise from a handler to fail a job at once, without retries (e.g. invalid input that will
    never succeed)."""


# Longest snooze: a day's backlog is what a snooze is for; longer is a unit mistake (ms for s).
MAX_SNOOZE_S = 7 * 86_400.0


class Snooze(DispatcherError):
    """Raise from a handler to run the job again `seconds` from now (database clock) without
    spending an attempt: "not yet" (a resource is busy, a rate limit says wait), not a failure.
    Each job may snooze DISPATCHER_MAX_SNOOZES times; beyond that a snooze is a failed attempt.
    A bad `seconds` raises ValueError here, in the handler: that attempt then fails with it."""

    def __init__(self, seconds: float, reason: str | None = None) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 <= seconds <= MAX_SNOOZE_S
        ):
            raise ValueError(
                f"Snooze(seconds) must be a number of seconds >= 0 and at most {MAX_SNOOZE_S:.0f} "
                f"(7 days), got {seconds!r}"
            )
        super().__init__(f"snoozed for {seconds:g} s" + (f": {reason}" if reason else ""))
        self.seconds = float(seconds)
        self.reason = reason


class Cancel(DispatcherError):
    """Raise from a handler to end its job `cancelled`, not failed: nothing went wrong, the work is
    no longer wanted (the order was refunded, the account closed). Never retried, whatever attempts
    are left; a keyed job releases its key to the key's next job, as after a success."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(
            f"cancelled by its handler: {reason}" if reason else "cancelled by its handler"
        )
        self.reason = reason


class JobFailed(DispatcherError):
    """What `JobHandle.result()` raises when the awaited job ended without success: `status` is
    'failed', 'discarded' or 'cancelled', `error` its last error (None if it had none)."""

    def __init__(self, job_id: int, status: str, error: str | None) -> None:
        super().__init__(f"job {job_id} ended {status}" + (f": {error}" if error else ""))
        self.job_id = job_id
        self.status = status
        self.error = error


class JobNotFound(DispatcherError, LookupError):
    """What `JobHandle.result()` raises when there is no such job (never enqueued, or its row was
    purged before anyone read it)."""
