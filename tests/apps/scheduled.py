"""Worker apps with recurring jobs, for the scheduler's multi-process tests
(tests/chaos/test_schedules.py).

Every execution of `tick` appends `job_id slot start pid` to RECORD_DIR/slots-<pid>.log, one
write per line: `slot` is the job's `scheduled_for` as the handler saw it (Unix seconds), `start`
the wall clock when it started. `registry`: one schedule every second; `catch_up_registry`:
three, one per catch_up policy.
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO

from dispatcher import Job, Registry

registry = Registry()
catch_up_registry = Registry()

_log: IO[str] | None = None
_log_lock = threading.Lock()


async def tick(job: Job) -> None:
    global _log
    slot = "-" if job.scheduled_for is None else f"{job.scheduled_for.timestamp():.6f}"
    with _log_lock:
        if _log is None:
            _log = open(  # noqa: SIM115  (kept open for the process's life, one per pid)
                os.path.join(os.environ["RECORD_DIR"], f"slots-{os.getpid()}.log"), "a", buffering=1
            )
        _log.write(f"{job.id} {slot} {time.time():.6f} {os.getpid()}\n")


registry.handler("tick")(tick)
registry.schedule("every-second", every_s=1, job_type="tick")

catch_up_registry.handler("tick")(tick)
for policy in ("latest", "all", "none"):
    catch_up_registry.schedule(f"catch-up-{policy}", every_s=1, job_type="tick", catch_up=policy)
