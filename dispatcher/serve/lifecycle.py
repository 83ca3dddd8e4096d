"""Process-level shutdown guarantees: signals, the exit deadline, and the hard exit.

The first SIGTERM/SIGINT starts the graceful shutdown and arms a watchdog that exits `bound_s`
later whatever blocks; a second signal exits at once. Why `signal.signal` and `os._exit`:
docs/design/worker.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from dispatcher.observe import logs

EXIT_FORCED = 1  # the process ended without every outcome written; leases recover the rest
# it gave up on handlers stuck past their timeout (runtime/stuck.py); leases recover their jobs
EXIT_STUCK = 3

# Signals received before the worker's loop runs (start-up: imports, config, the schema check
# under load can take seconds), replayed by ShutdownSignals.install(). Without this a SIGTERM in
# that window kills the process with the default action (exit -15) instead of a clean exit 0.
_early: list[int] = []


def install_early() -> None:
    """Catch SIGTERM/SIGINT from the first moment `dispatcher run` starts (see _early)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _early_handler)


def _early_handler(signum: int, frame: FrameType | None) -> None:
    _early.append(signum)
    if len(_early) > 1:
        hard_exit(f"received {signal.Signals(signum).name} again while starting")


def hard_exit(reason: str, code: int = EXIT_FORCED) -> None:
    """End the process now, after one line on stderr; never returns."""
    text = (
        f"{reason}; exiting now with code {code}; unfinished jobs come back when their leases "
        "run out"
    )
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    try:
        # In the configured format (a JSON line in the json format), with the worker id, redacted.
        os.write(2, (logs.render(logging.ERROR, "dispatcher", text) + "\n").encode())
    finally:
        os._exit(code)  # whatever happened above


class ShutdownSignals:
    """SIGTERM/SIGINT handling for one worker process (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_stop: Callable[[], None],
        *,
        bound_s: float,
        announce: Callable[[str], None],
    ) -> None:
        self._loop = loop
        self._on_stop = on_stop
        self._bound_s = bound_s
        self._announce = announce
        self._seen = 0
        self._watchdog: threading.Timer | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        for signum in _early:  # received while starting: act on it now
            self._handle(signum, None)
        _early.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._seen += 1
        name = signal.Signals(signum).name
        if self._seen > 1:
            hard_exit(f"received {name} again during shutdown")
        self.arm()
        # Logged from the loop, not here: a signal handler may interrupt a logging call.
        self._loop.call_soon_threadsafe(
            self._announce,
            f"received {name}: stopping gracefully (the process "
            f"ends within {self._bound_s:g} s; a second signal ends it at once)",
        )
        self._loop.call_soon_threadsafe(self._on_stop)

    def arm(self, code: int = EXIT_FORCED) -> None:
        """Start the exit deadline, `bound_s` from now (once: a later call keeps the first deadline
        and code); a worker that stops without a signal (it gave up on stuck handlers) calls it."""
        if self._watchdog is None:
            bound_s = self._bound_s
            self._watchdog = threading.Timer(
                bound_s, hard_exit, (f"shutdown overran its {bound_s:g} s bound", code)
            )
            self._watchdog.daemon = True
            self._watchdog.start()
