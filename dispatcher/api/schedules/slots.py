"""When a recurring schedule fires: the pure "next slot" logic of cron expressions and fixed
intervals.

A `Cadence` is parsed once from what the user gave (a 5-field cron expression or a macro, read in
an IANA time zone, or `every_s`) and answers "the first slot after t" and "the latest slots at or
before t" as aware UTC datetimes. No I/O, no clock: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The largest UTC-offset change of any zone's DST or law change (Lord Howe shifts 30 min, Antarctic
# stations up to 3 h): how far a wall clock can jump, so how far around a time we must look.
MAX_SHIFT = timedelta(hours=3)
# A fixed date from which parse() checks that an expression fires at all (cronsim gives up after 50
# years).
_PROBE = datetime(2000, 1, 1)


class ScheduleError(ValueError):
    """A bad cron expression, time zone or interval; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Cadence:
    """When a schedule's slots fall: a 5-field cron expression read in a time zone, or a fixed
    interval."""

    expression: str | None
    every_s: int | None
    time_zone: str = "UTC"

    @classmethod
    def parse(
        cls, expression: str | None = None, *, every_s: int | float | None = None, tz: str = "UTC"
    ) -> Cadence:
        """Exactly one of expression / every_s. Raises ScheduleError with a clear message."""
        if (expression is None) == (every_s is None):
            which = "both were given" if expression is not None else "neither was given"
            raise ScheduleError(f"give exactly one of a cron expression and every_s ({which})")
        if every_s is not None:
            # intervals count from the epoch, zone-free
            return cls(None, _whole_seconds(every_s), "UTC")
        if not isinstance(expression, str):
            raise ScheduleError(f"a cron expression is text, not {type(expression).__name__}")
        canonical = _canonical(expression)
        _zone(tz)
        return cls(canonical, None, tz)

    @property
    def text(self) -> str:
        """What `schedules list` shows: "0 3 * * *" or "every 30s"."""
        return self.expression if self.expression is not None else f"every {self.every_s}s"

    @property
    def fixed_time(self) -> bool:
        """Whether DST maps this expression by wall-clock time (minute and hour fields don't
        start with '*')."""
        if self.expression is None:
            return False
        minute, hour = self.expression.split()[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def next_after(self, after: datetime) -> datetime:
        """The first slot strictly after `after` (aware, any zone), as an aware UTC datetime."""
        after = _utc(after)
        if self.every_s is not None:
            step = timedelta(seconds=self.every_s)
            return EPOCH + ((after - EPOCH) // step + 1) * step
        tz = ZoneInfo(self.time_zone)
        # An instant after `after` can have an earlier wall time only if the clocks go back within
        # MAX_SHIFT of it: look back that far only then.
        back = MAX_SHIFT if _offset(after, tz) != _offset(after + MAX_SHIFT, tz) else timedelta(0)
        best: datetime | None = None
        stop: datetime | None = None
        matches = CronSim(self.expression or "", (_wall(after, tz) - back).replace(microsecond=0))
        try:
            for naive in matches:
                if stop is not None and naive > stop:
                    break
                for instant in self._instants(naive, tz):
                    if instant > after and (best is None or instant < best):
                        best = instant
                        # A later wall time maps to an earlier instant only across a fall-back just
                        # before.
                        ahead = (
                            MAX_SHIFT
                            if _offset(best - MAX_SHIFT, tz) != _offset(best, tz)
                            else timedelta(0)
                        )
                        stop = _wall(best, tz) + ahead
        except StopIteration:
            pass
        if best is None:
            raise ScheduleError(
                f"cron expression {self.expression!r} has no slot in the 50 years after {after}"
            )
        return best

    def latest_at_or_before(self, at: datetime, count: int = 1) -> list[datetime]:
        """The `count` latest slots <= at, ascending, aware UTC (fewer if none for 50 years
        before)."""
        at = _utc(at)
        if count < 1:
            return []
        if self.every_s is not None:
            step = timedelta(seconds=self.every_s)
            last = (at - EPOCH) // step
            return [EPOCH + (last - i) * step for i in range(count - 1, -1, -1)]
        tz = ZoneInfo(self.time_zone)
        # Mirror of next_after: an earlier instant has a later wall time only after a fall-back
        # within MAX_SHIFT before `at`. Reverse iteration keeps a week of "* * * * *" out of the
        # loop.
        ahead = MAX_SHIFT if _offset(at - MAX_SHIFT, tz) != _offset(at, tz) else timedelta(0)
        start = (_wall(at, tz) + ahead).replace(microsecond=0) + timedelta(seconds=1)
        found: set[datetime] = set()
        stop: datetime | None = None
        try:
            for naive in CronSim(self.expression or "", start, reverse=True):
                if stop is not None and naive < stop:
                    break
                new = [i for i in self._instants(naive, tz) if i <= at and i not in found]
                if new:
                    found.update(new)
                    if len(found) >= count:
                        floor = sorted(found)[-count]
                        back = (
                            MAX_SHIFT
                            if _offset(floor, tz) != _offset(floor + MAX_SHIFT, tz)
                            else timedelta(0)
                        )
                        stop = _wall(floor, tz) - back
        except StopIteration:
            pass
        return sorted(found)[-count:]

    def period_s(self, at: datetime) -> float:
        """Real seconds between the first slot after `at` and the one after it."""
        first = self.next_after(at)
        return (self.next_after(first) - first).total_seconds()

    def _instants(self, naive: datetime, tz: ZoneInfo) -> list[datetime]:
        """The real instants (UTC) of a naive local cron match, by the DST rules of Debian cron."""
        early = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
        late = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
        if early == late:
            return [early]
        if early < late:  # the wall time occurs twice (fall-back)
            return [early] if self.fixed_time else [early, late]
        # The wall time does not exist (spring-forward): fold=0 reads it with the offset before the
        # jump, fold=1 with the one after, so the jump lies in (late, early]. A fixed time fires at
        # the jump.
        return [_jump(late, early, tz)] if self.fixed_time else []


def _canonical(expression: str) -> str:
    """The 5-field text of an expression or macro, checked by cronsim; ScheduleError if it is not
    one."""
    fields = expression.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        macro = fields[0].lower()
        if macro not in MACROS:
            known = ", ".join(sorted(MACROS))
            raise ScheduleError(
                f"unsupported cron macro {expression.strip()!r} (known: {known}; @reboot is not)"
            )
        fields = MACROS[macro].split()
    if len(fields) != 5:
        raise ScheduleError(
            f"bad cron expression {expression!r}: expected 5 fields (minute hour day-of-month "
            f"month day-of-week), got {len(fields)}"
        )
    text = " ".join(fields)
    try:
        next(CronSim(text, _PROBE))
    except CronSimError as exc:
        if str(exc) == "Bad day-of-month" and _valid(f"0 0 {fields[2]} * *"):
            # cronsim rejects "30 2" at construction: a valid day that no chosen month has.
            raise ScheduleError(
                f"cron expression {expression!r} never fires (no month in it has that day)"
            ) from None
        raise ScheduleError(f"bad cron expression {expression!r}: {exc}") from None
    except StopIteration:
        raise ScheduleError(f"cron expression {expression!r} never fires") from None
    return text


def _valid(text: str) -> bool:
    try:
        CronSim(text, _PROBE)
    except CronSimError:
        return False
    return True


def _zone(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ScheduleError(f"unknown time zone {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {tz!r}") from None


def _whole_seconds(every_s: object) -> int:
    # bool is an int subclass: True is not "1 second".
    if isinstance(every_s, float) and every_s.is_integer():
        every_s = int(every_s)
    if isinstance(every_s, bool) or not isinstance(every_s, int) or every_s < 1:
        raise ScheduleError(f"every_s must be a whole number of seconds >= 1, not {every_s!r}")
    return every_s


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a time zone-aware datetime is needed, not {moment!r}")
    return moment.astimezone(UTC)


def _wall(instant: datetime, tz: ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def _offset(instant: datetime, tz: ZoneInfo) -> timedelta | None:
    return instant.astimezone(tz).utcoffset()


def _jump(lo: datetime, hi: datetime, tz: ZoneInfo) -> datetime:
    """The first instant in (lo, hi] whose offset differs from lo's: when the clocks jumped."""
    before = _offset(lo, tz)
    lo_s, hi_s = int((lo - EPOCH).total_seconds()), int((hi - EPOCH).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if _offset(EPOCH + timedelta(seconds=mid), tz) == before:
            lo_s = mid
        else:
            hi_s = mid
    return EPOCH + timedelta(seconds=hi_s)
