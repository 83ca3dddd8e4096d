"""An app whose import configures logging as a Django project's LOGGING does: `dictConfig` with
`disable_existing_loggers` true, its own handler and format on the root logger at WARNING
(tests/integration/test_app_logging.py). Its handlers log through their own logger.

- `send_async` / `send_sync`: log a WARNING line naming the payload's `to`;
- `explode`: raises (enqueue it with max_attempts=1: it fails for good at once).
"""

from __future__ import annotations

import logging
import logging.config

from dispatcher import Job, Registry

logging.config.dictConfig(
    {
        "version": 1,
        "disable_existing_loggers": True,
        "formatters": {"app": {"format": "APP %(levelname)s %(name)s: %(message)s"}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "app",
                "stream": "ext://sys.stdout",
            }
        },
        "root": {"handlers": ["console"], "level": "WARNING"},
    }
)

log = logging.getLogger("ecoapp")
registry = Registry()


@registry.handler("send_async")
async def send_async(job: Job) -> None:
    log.warning("sent email to %s", job.payload["to"])


@registry.handler("send_sync")
def send_sync(job: Job) -> None:
    log.warning("sent email to %s", job.payload["to"])


@registry.handler("explode")
def explode(job: Job) -> None:
    raise RuntimeError("boom")
