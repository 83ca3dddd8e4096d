"""Log storm control: a handler filter that lets a burst of similar lines through and counts the
rest.

Similar: same logger, level and message template. The first `burst` lines of a `window_s` window
pass; the next line after the window carries the count, and a key gone quiet gets one summary
line. No thread; thread-safe. Details: docs/design/logging.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

BURST = 10  # lines of one key let through per window: enough to see a storm's shape
WINDOW_S = 10.0  # at most 1 line/s per key in a storm, plus one summary per window

# Attributes set on the records this filter annotates or makes (formatters read them).
SUPPRESSED = "suppressed"  # int: similar lines dropped before this one (a field of the line)
SUPPRESSED_S = "_suppressed_s"  # float: over how many seconds (only in the text of the line)
_SUMMARY = "_storm_summary"  # a summary this filter made: let it through uncounted

Key = tuple[str, int, Any]


class _Window:
    __slots__ = ("dropped", "last", "passed", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.passed = 1
        self.dropped = 0
        self.last: logging.LogRecord | None = None  # the last line dropped: the summary quotes it


class StormFilter(logging.Filter):
    """Rate-limits similar lines (see the module docstring). `emit` receives the summary records
    of keys that went quiet (the handler's `handle`); `clock` is injectable for tests."""

    def __init__(
        self,
        *,
        burst: int = BURST,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[logging.LogRecord], Any] | None = None,
    ) -> None:
        super().__init__()
        if burst < 1 or window_s <= 0:
            raise ValueError("burst must be >= 1 and window_s > 0")
        self.burst = burst
        self.window_s = window_s
        self.emit = emit
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Key, _Window] = {}
        self._next_sweep = clock() + window_s
        self.dropped_total = 0  # every line dropped since start

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        msg = record.msg
        key = (record.name, record.levelno, msg if isinstance(msg, str) else type(msg))
        now = self._clock()
        quiet: list[tuple[Key, _Window]] = []
        with self._lock:
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

    def _sweep(self, now: float) -> list[tuple[Key, _Window]]:
        """Forget expired windows; return those that dropped lines (their count is due). Under
        the lock."""
        self._next_sweep = now + self.window_s
        expired = [(k, w) for k, w in self._windows.items() if now - w.start >= self.window_s]
        for k, _ in expired:
            del self._windows[k]
        return [(k, w) for k, w in expired if w.dropped]

    def drain(self) -> list[logging.LogRecord]:
        """Summaries of every count not yet reported (at shutdown); the table is emptied."""
        now = self._clock()
        with self._lock:
            pending = [(k, w) for k, w in self._windows.items() if w.dropped]
            self._windows.clear()
        return [_summary(w, now) for _, w in pending]

    def _summarise(self, quiet: list[tuple[Key, _Window]], now: float) -> None:
        if quiet and self.emit is not None:
            for _, window in quiet:
                self.emit(_summary(window, now))


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
