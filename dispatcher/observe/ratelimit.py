"""Log storm control: a handler filter that lets a burst of similar lines through and counts the
rest.

Similar: same logger, level and message template, and the same shape: the line as written with
its numbers, hex ids and UUIDs masked. A hot loop's lines differ only in ids, counts and durations
and collapse; distinct one-off lines of one template (each applied migration) differ in words and
all pass. A template that makes more than `shapes` shapes in a window collapses under the template
alone from then on. The first `burst` lines of a key's `window_s` window pass; the next line after
the window carries the count, and a key gone quiet gets one summary line. No thread; thread-safe.
Details: docs/design/logging.md.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

BURST = 10  # lines of one key let through per window: enough to see a storm's shape
WINDOW_S = 10.0  # at most 1 line/s per key in a storm, plus one summary per window
# Distinct shapes of one template per window before it collapses under the template: well above
# the migrations one `dispatcher migrate` applies, well below a storm of lines that each quote
# something new (an error text with a user's input).
SHAPES = 64
# What varies within one event: UUIDs, hex runs with a digit (ids, hashes), numbers. A word with no
# digit stays: "deadbeef" is a word here, "3f9a2c" an id.
_VARIABLE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|\b(?:0[xX])?(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]+\b"
    r"|[0-9]+"
)
SHAPE_CHARS = 1000  # of a line, masked: the cost of a huge line's shape is bounded
_OVERFLOW = None  # the shape of a template's key once it made more than `shapes` of them

# Attributes set on the records this filter annotates or makes (formatters read them).
SUPPRESSED = "suppressed"  # int: similar lines dropped before this one (a field of the line)
SUPPRESSED_S = "_suppressed_s"  # float: over how many seconds (only in the text of the line)
_SUMMARY = "_storm_summary"  # a summary this filter made: let it through uncounted

Key = tuple[str, int, Any, str | None]
Family = tuple[str, int, Any]  # one template's keys: logger, level, template


class _Window:
    __slots__ = ("dropped", "last", "passed", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.passed = 1
        self.dropped = 0
        self.last: logging.LogRecord | None = None  # the last line dropped: the summary quotes it


class _Family:
    """The shapes one template opened in its current window."""

    __slots__ = ("shapes", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.shapes = 0


class StormFilter(logging.Filter):
    """Rate-limits similar lines (see the module docstring). `emit` receives the summary records
    of keys that went quiet (the handler's `handle`); `clock` is injectable for tests."""

    def __init__(
        self,
        *,
        burst: int = BURST,
        window_s: float = WINDOW_S,
        shapes: int = SHAPES,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[logging.LogRecord], Any] | None = None,
    ) -> None:
        super().__init__()
        if burst < 1 or window_s <= 0 or shapes < 1:
            raise ValueError("burst and shapes must be >= 1 and window_s > 0")
        self.burst = burst
        self.window_s = window_s
        self.shapes = shapes
        self.emit = emit
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Key, _Window] = {}
        self._families: dict[Family, _Family] = {}
        self._next_sweep = clock() + window_s
        self.dropped_total = 0  # every line dropped since start

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        msg = record.msg
        family: Family = (record.name, record.levelno, msg if isinstance(msg, str) else type(msg))
        shape = _shape(record)
        now = self._clock()
        quiet: list[tuple[Key, _Window]] = []
        with self._lock:
            key: Key = (*family, shape)
            window = self._windows.get(key)
            if window is None or now - window.start >= self.window_s:
                key = self._opening(family, key, now)
                window = self._windows.get(key)
            if window is None or now - window.start >= self.window_s:
                self._windows[key] = _Window(now)
                if window is not None and window.dropped:
                    setattr(record, SUPPRESSED, window.dropped)
                    setattr(record, SUPPRESSED_S, now - window.start)
                keep = True
            elif window.passed < self.burst:
                window.passed += 1
                keep = True
            else:
                window.dropped += 1
                window.last = record
                self.dropped_total += 1
                keep = False
            # after this key's own roll-over: its line carries its count
            if now >= self._next_sweep:
                quiet = self._sweep(now)
        # outside the lock: emitting runs the handler, which logs nothing of ours
        self._summarise(quiet, now)
        return keep

    def _opening(self, family: Family, key: Key, now: float) -> Key:
        """The key a shape that opens a window counts under: its own while its template made
        at most `shapes` shapes in the template's window, else the template's. Under the lock."""
        seen = self._families.get(family)
        if seen is None or now - seen.start >= self.window_s:
            seen = self._families[family] = _Family(now)
        if seen.shapes >= self.shapes:
            return (*family, _OVERFLOW)
        seen.shapes += 1
        return key

    def _sweep(self, now: float) -> list[tuple[Key, _Window]]:
        """Forget expired windows; return those that dropped lines (their count is due). Under
        the lock."""
        self._next_sweep = now + self.window_s
        expired = [(k, w) for k, w in self._windows.items() if now - w.start >= self.window_s]
        for k, _ in expired:
            del self._windows[k]
        for f in [f for f, s in self._families.items() if now - s.start >= self.window_s]:
            del self._families[f]
        return [(k, w) for k, w in expired if w.dropped]

    def drain(self) -> list[logging.LogRecord]:
        """Summaries of every count not yet reported (at shutdown); the table is emptied."""
        now = self._clock()
        with self._lock:
            pending = [(k, w) for k, w in self._windows.items() if w.dropped]
            self._windows.clear()
            self._families.clear()
        return [_summary(w, now) for _, w in pending]

    def _summarise(self, quiet: list[tuple[Key, _Window]], now: float) -> None:
        if quiet and self.emit is not None:
            for _, window in quiet:
                self.emit(_summary(window, now))


def _shape(record: logging.LogRecord) -> str:
    """The line as written with what varies within one event masked: "job # failed (attempt
    #/#)"."""
    try:
        text = record.getMessage()
    except Exception:  # bad arguments: the logging module reports them when it formats
        text = str(record.msg)
    return _VARIABLE.sub("#", text[:SHAPE_CHARS])


def _summary(window: _Window, now: float) -> logging.LogRecord:
    """One line for a key that went quiet: its logger and level, the count, and the last line
    dropped."""
    last = window.last
    assert last is not None  # set with every drop
    try:
        text = last.getMessage()
    except Exception:
        text = str(last.msg)
    record = logging.LogRecord(
        last.name,
        last.levelno,
        last.pathname,
        last.lineno,
        "%d similar lines suppressed in the last %.3g s; the last one: %s",
        (window.dropped, now - window.start, text),
        None,
        last.funcName,
    )
    setattr(record, SUPPRESSED, window.dropped)
    setattr(record, _SUMMARY, True)
    return record
