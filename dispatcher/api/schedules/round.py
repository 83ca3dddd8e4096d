"""One scheduler round for one queue: the declarations against the database's copy, the slots to
enqueue, the cursors, the runs that ended. One transaction behind a try-lock (sql/schedules.sql).

`plan_slots` is the pure part: from a schedule's cursor and the database's now, which slots get a
job (ahead of time, or missed ones by the schedule's catch_up) and where the cursor goes next.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from dispatcher.api.schedules.declarations import (
    CATCH_UP_ALL,
    CATCH_UP_ALL_MAX,
    CATCH_UP_LATEST,
    Schedule,
)
from dispatcher.api.schedules.slots import Cadence
from dispatcher.constants import NOTIFY_CHANNEL, NUM_BUCKETS
from dispatcher.db import rows
from dispatcher.db.inserts import raw_json
from dispatcher.db.listener import format_payload
from dispatcher.db.queries import query
from dispatcher.db.rows import StoredSchedule
from dispatcher.db.store import SLOW_STATEMENT, JobStore

# Slots one schedule enqueues in one round, at most: a round's transaction stays short whatever
# the cadence (an every-second schedule needs LOOKAHEAD_S of them at its first round).
MAX_SLOTS_PER_ROUND = 200


@dataclass(frozen=True, slots=True)
class SlotPlan:
    enqueue: list[datetime]  # ascending
    next_slot_at: datetime  # the new cursor: the earliest slot not decided
    # The missed slots left without a job: from the first of them, up to (not including) the second.
    missed: tuple[datetime, datetime] | None = None
    missed_run: int = 0  # how many missed slots get a job (by catch_up)


def plan_slots(
    cadence: Cadence,
    catch_up: str,
    cursor: datetime,
    now: datetime,
    *,
    lookahead_s: float,
    late_s: float,
) -> SlotPlan:
    """A slot more than `late_s` in the past when a round first sees it was missed (no holder was
    up to enqueue it ahead): catch_up decides whether it runs. Every other slot up to
    `now + lookahead_s` gets its job now, due at the slot."""
    enqueue: list[datetime] = []
    missed: tuple[datetime, datetime] | None = None
    missed_until = now - timedelta(seconds=late_s)
    if cursor <= missed_until:
        keep = (
            CATCH_UP_ALL_MAX
            if catch_up == CATCH_UP_ALL
            else 1
            if catch_up == CATCH_UP_LATEST
            else 0
        )
        latest = [s for s in cadence.latest_at_or_before(missed_until, max(keep, 1)) if s >= cursor]
        enqueue = latest[len(latest) - keep :] if keep else []
        if latest and (not enqueue or enqueue[0] > cursor):  # some missed slots get no job
            missed = (cursor, enqueue[0] if enqueue else missed_until)
        cursor = cadence.next_after(missed_until)
    missed_run = len(enqueue)
    horizon = now + timedelta(seconds=lookahead_s)
    while cursor <= horizon and len(enqueue) < MAX_SLOTS_PER_ROUND:
        enqueue.append(cursor)
        cursor = cadence.next_after(cursor)
    return SlotPlan(enqueue, cursor, missed, missed_run)


@dataclass(slots=True)
class ScheduleRound:
    """What one round did for one queue."""

    now: datetime
    enqueued: dict[str, int] = field(default_factory=dict)  # schedule -> jobs enqueued
    missed: dict[str, SlotPlan] = field(default_factory=dict)  # schedules with missed slots
    declared: list[str] = field(default_factory=list)  # new, changed or declared again
    removed: list[str] = field(default_factory=list)
    # Each declared schedule's last success (epoch seconds), or when it was first declared if it
    # never succeeded: what the "has not succeeded within its period" alert counts from.
    last_success: dict[str, float] = field(default_factory=dict)
    settled: int = 0


async def schedule_round(
    store: JobStore,
    queue: str,
    declared: Sequence[Schedule],
    *,
    gone: str,
    lookahead_s: float,
    late_s: float,
    keep_runs: int,
) -> ScheduleRound | None:
    """One round for `queue`: None if another round of the queue holds its lock (never waited
    for)."""
    names = [s.name for s in declared]

    async def work(conn: psycopg.AsyncConnection[Any]) -> ScheduleRound | None:
        async with conn.transaction():
            cur = await conn.execute(query("schedules_try_lock"), {"queue": queue})
            if not rows.value(await cur.fetchone()):
                return None
            now = rows.value(await (await conn.execute(query("db_now"))).fetchone())
            cur = await conn.execute(query("schedules_read"), {"queue": queue, "names": names})
            stored = rows.stored_schedules(await cur.fetchall())
            done = ScheduleRound(now)
            if not declared and not stored:
                return done  # the common case of a queue without schedules: three cheap statements
            for s in declared:
                cursor = await _declare(conn, s, stored.get(s.name), now, done)
                plan = plan_slots(
                    s.cadence, s.catch_up, cursor, now, lookahead_s=lookahead_s, late_s=late_s
                )
                done.enqueued[s.name] = await _enqueue(conn, s, plan.enqueue)
                if plan.missed is not None:
                    done.missed[s.name] = plan
                if plan.next_slot_at != cursor:
                    await conn.execute(
                        query("schedule_advance"),
                        {"name": s.name, "next_slot_at": plan.next_slot_at},
                    )
            for name, st in stored.items():
                if name not in done.enqueued and not st.removed:
                    await conn.execute(query("schedule_remove"), {"name": name})
                    await conn.execute(query("schedule_drop_ahead"), {"name": name})
                    done.removed.append(name)
            cur = await conn.execute(
                query("schedule_runs_settle"), {"names": list(stored) + done.declared, "gone": gone}
            )
            runs = rows.typed_one(rows.SettledRuns, await cur.fetchone())
            assert runs is not None  # an aggregate: always one row
            succeeded = runs.succeeded
            done.settled = int(runs.settled)
            await conn.execute(query("schedule_runs_prune"), {"names": names, "keep": keep_runs})
            for s in declared:
                known = stored.get(s.name)
                at = succeeded.get(s.name)
                since = now if known is None else known.last_success_at or known.declared_at
                done.last_success[s.name] = float(at) if at is not None else since.timestamp()
        return done

    return await store.run("schedules", work, budget=SLOW_STATEMENT)


async def _declare(
    conn: psycopg.AsyncConnection[Any],
    s: Schedule,
    st: StoredSchedule | None,
    now: datetime,
    done: ScheduleRound,
) -> datetime:
    """The schedule's cursor; a new, changed or re-declared schedule starts at its next slot, and a
    changed one first drops the jobs its old declaration enqueued ahead."""
    if st is not None and not st.removed and st.fingerprint == s.fingerprint:
        return st.next_slot_at
    if st is not None:
        await conn.execute(query("schedule_drop_ahead"), {"name": s.name})
    cursor = s.cadence.next_after(now)
    await conn.execute(
        query("schedule_declare"),
        {
            "name": s.name,
            "queue": s.queue,
            "job_type": s.job_type,
            "cadence": s.cadence.text,
            "time_zone": s.cadence.time_zone,
            "catch_up": s.catch_up,
            "fingerprint": s.fingerprint,
            "next_slot_at": cursor,
        },
    )
    done.declared.append(s.name)
    return cursor


async def _enqueue(conn: psycopg.AsyncConnection[Any], s: Schedule, slots: list[datetime]) -> int:
    """One job per slot, each in one statement with its slot's row; returns how many were new."""
    enqueued = 0
    for slot in slots:
        bucket = random.randrange(NUM_BUCKETS)
        params = {
            "name": s.name,
            "slot_at": slot,
            "queue": s.queue,
            "job_type": s.job_type,
            "payload": Jsonb(s.payload, dumps=raw_json),
            "priority": s.priority,
            "bucket": bucket,
            "max_attempts": s.max_attempts,
            "channel": NOTIFY_CHANNEL,
            "notify": format_payload(s.queue, bucket),
        }
        if await (await conn.execute(query("schedule_enqueue_slot"), params)).fetchone():
            enqueued += 1
    return enqueued
