"""Jobs of a type this worker has no handler for: handed back, never failed for it.

During a rolling deploy that adds a job type, old pods claim the new type's jobs. Each one goes
back to the queue with its attempt given back and its ordering key kept (db/handbacks.py), due
again after a delay that grows with how long this worker has been seeing the type unserved (2 s at
first, up to 5 min), so an old pod left running does not churn on them. A type that no worker in
the registry has served for the unserved window (runtime/presence.py) has its jobs older than that
window discarded, with a reason. Logged once per type and outcome; counted in
dispatcher_jobs_unserved_total.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from dispatcher.backoff import jittered
from dispatcher.constants import UNSERVED_DISCARD_PREFIX
from dispatcher.db.handbacks import HandBack, HandedBack
from dispatcher.model import Job
from dispatcher.observe import metrics

log = logging.getLogger(__name__)

HAND_BACK_MIN_S = 2.0
HAND_BACK_MAX_S = 300.0
# the delay is this share of the time the type has been unserved here (10 min unserved: 1 min)
HAND_BACK_GROWTH = 0.1

_logged: set[tuple[str, str]] = set()  # (job_type, outcome) already logged by this process


class Unserved:
    def __init__(
        self,
        worker_id: str,
        known_types: Callable[[], Sequence[str]],
        window_s: float,
        served_lately: Callable[[str], bool | None] = lambda job_type: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`served_lately(job_type)`: whether some worker served it within `window_s` (None: not
        known yet, so nothing is discarded)."""
        self._worker_id = worker_id
        self._known_types = known_types
        self.window_s = window_s
        self._served_lately = served_lately
        self._clock = clock
        self._first_seen: dict[str, float] = {}

    def hand_back(self, job: Job) -> HandBack:
        now = self._clock()
        first = self._first_seen.setdefault(job.job_type, now)
        if first == now and (job.job_type, "handed_back") not in _logged:
            _logged.add((job.job_type, "handed_back"))
            log.warning(
                "job_type %r has no handler in worker %s (known: %s): its jobs are handed back, "
                "their attempt not spent, for a worker that serves it (a rollout in progress?); "
                "discarded once no worker has served it for %g s",
                job.job_type,
                self._worker_id,
                ", ".join(self._known_types()) or "none",
                self.window_s,
                extra={"job_type": job.job_type},
            )
        delay_s = min(HAND_BACK_MAX_S, max(HAND_BACK_MIN_S, (now - first) * HAND_BACK_GROWTH))
        return HandBack(
            job,
            jittered(delay_s, 0.2),
            self._served_lately(job.job_type) is False,
            f"{UNSERVED_DISCARD_PREFIX} job_type {job.job_type!r} for {self.window_s:g} s "
            "(DISPATCHER_UNSERVED_TYPE_DISCARD_S); until then its jobs were handed back",
        )


def written(handed: Sequence[HandedBack]) -> None:
    """After the write: count each outcome, and log a type's first discard."""
    for h in handed:
        outcome = "handed_back" if h.status == "queued" else h.status
        metrics.JOBS_UNSERVED.labels(h.queue, h.job_type, outcome).inc()
        if outcome == "discarded" and (h.job_type, outcome) not in _logged:
            _logged.add((h.job_type, outcome))
            log.error(
                "jobs of job_type %r discarded (job %d first): no worker has served the type "
                "lately; retry them once a worker serves it (dispatcher jobs retry --type %s)",
                h.job_type,
                h.id,
                h.job_type,
                extra={"job_type": h.job_type, "job_id": h.id},
            )
