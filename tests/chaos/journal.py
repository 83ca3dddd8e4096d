"""The database's own record of what happened to each job, for fault tests.

A trigger appends a row to `chaos_journal` at every change of a job's status or claim token:
each claim, completion, failure, retry, reaped lease and release, with the row's owner before
and after and the lease that was in force. Heartbeats (lease_expires_at only) are not logged.
`at` is the writing transaction's now(), the same clock as locked_at and lease_expires_at.
Rows are written in the transaction that changes the job, so they are lost exactly when the
change is (an immediate PostgreSQL shutdown with asynchronous commit): the journal never
disagrees with the table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from tests.helpers import fetchall

JOURNAL_SQL = """
CREATE TABLE chaos_journal (
    seq                  bigserial PRIMARY KEY,
    job_id               bigint NOT NULL,
    old_status           text NOT NULL,
    new_status           text NOT NULL,
    attempts             int NOT NULL,
    old_locked_by        text,
    new_locked_by        text,
    old_token            uuid,
    new_token            uuid,
    locked_at            timestamptz,
    old_lease_expires_at timestamptz,
    lease_expired        boolean NOT NULL,
    at                   timestamptz NOT NULL
);
CREATE FUNCTION chaos_journal_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_journal (job_id, old_status, new_status, attempts,
                               old_locked_by, new_locked_by, old_token, new_token, locked_at,
                               old_lease_expires_at, lease_expired, at)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, OLD.locked_by, NEW.locked_by,
            OLD.lock_token, NEW.lock_token, NEW.locked_at, OLD.lease_expires_at,
            NEW.lease_expiries > OLD.lease_expiries, now());
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_journal AFTER UPDATE ON dispatcher_jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.lock_token IS DISTINCT FROM NEW.lock_token)
    EXECUTE FUNCTION chaos_journal_write();
"""


def install_journal(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(JOURNAL_SQL)


@dataclass(frozen=True)
class Entry:
    seq: int  # the order the changes happened in (a job's next change sees its previous one)
    job_id: int
    old_status: str
    new_status: str
    attempts: int
    old_locked_by: str | None
    new_locked_by: str | None
    locked_at: datetime | None
    old_lease_expires_at: datetime | None
    lease_expired: bool
    at: datetime

    @property
    def is_claim(self) -> bool:
        return self.old_status == "queued" and self.new_status == "running"


def entries(dsn: str) -> list[Entry]:
    rows: list[tuple[Any, ...]] = fetchall(
        dsn,
        "SELECT seq, job_id, old_status, new_status, attempts, old_locked_by, new_locked_by, "
        "locked_at, old_lease_expires_at, lease_expired, at FROM chaos_journal ORDER BY seq",
    )
    return [Entry(*row) for row in rows]


def completions(journal: list[Entry]) -> Counter[int]:
    """job id -> how many times it was marked completed (exactly once each, in a correct run)."""
    return Counter(e.job_id for e in journal if e.new_status == "completed")


def completed_by(journal: list[Entry]) -> dict[int, str | None]:
    """job id -> the worker whose claim the (last) completion was written for."""
    return {e.job_id: e.old_locked_by for e in journal if e.new_status == "completed"}


def claims_by(journal: list[Entry], worker: str) -> set[int]:
    return {e.job_id for e in journal if e.is_claim and e.new_locked_by == worker}


def expired_leases_of(journal: list[Entry], worker: str) -> list[Entry]:
    """The reaper's writes for leases `worker` held and let run out (its death or stall)."""
    return [e for e in journal if e.lease_expired and e.old_locked_by == worker]


@dataclass(frozen=True)
class Takeover:
    job_id: int
    lease_expired_at: datetime  # the dead holder's lease, as last extended
    reclaimed_at: datetime  # locked_at of the next claim
    reclaimed_by: str | None

    @property
    def delay_s(self) -> float:
        return (self.reclaimed_at - self.lease_expired_at).total_seconds()


def takeovers(journal: list[Entry], worker: str) -> tuple[list[Takeover], list[int]]:
    """For each lease of `worker` that expired: when it expired and when the job was claimed
    next. Returns (taken over, job ids never claimed again)."""
    done, never = [], []
    for reaped in expired_leases_of(journal, worker):
        after = [
            e for e in journal if e.job_id == reaped.job_id and e.is_claim and e.seq > reaped.seq
        ]
        if not after:
            never.append(reaped.job_id)
            continue
        assert reaped.old_lease_expires_at is not None and after[0].locked_at is not None
        done.append(
            Takeover(
                reaped.job_id,
                reaped.old_lease_expires_at,
                after[0].locked_at,
                after[0].new_locked_by,
            )
        )
    return done, never
