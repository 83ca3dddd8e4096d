"""The defaults of the worker's settings, each with the reason for its number, and the words a
few settings accept. fields.py declares the settings with them."""

from __future__ import annotations

import re

# Defaults, with the reason for each number.
DEFAULT_CONCURRENCY = 100  # jobs running at once per worker process
DEFAULT_BATCH_SIZE = 500  # max jobs per claim statement: ~0.002 round trips per job
DEFAULT_POLL_INTERVAL_S = 1.0  # idle fallback poll; LISTEN/NOTIFY wakes us sooner
DEFAULT_LEASE_S = 30.0  # a crashed worker's jobs come back after at most this
DEFAULT_JOB_TIMEOUT_S = 600.0  # per-job wall-clock limit; 0 disables
DEFAULT_RETRY_BASE_S = 1.0  # first retry waits up to 1 s ...
DEFAULT_RETRY_CAP_S = 900.0  # ... doubling per attempt, capped at 15 min
# a job snoozing more than this is stuck, not waiting: its snoozes become failures
DEFAULT_MAX_SNOOZES = 100
# A job whose type no worker has served for this long is discarded (until then it is handed back)
DEFAULT_UNSERVED_TYPE_DISCARD_S = 3600.0
DEFAULT_FLUSH_INTERVAL_S = 0.05  # completions are written at most 50 ms late (River's figure)
# A handler's return value is stored with its job up to this size (JSON): enough for ids, counts, a
# summary; a bigger result belongs in object storage, with its address in the result.
DEFAULT_MAX_RESULT_BYTES = 64 * 1024
DEFAULT_FLUSH_MAX = 2000  # ... or as soon as 2,000 are pending
DEFAULT_SHUTDOWN_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds is 30
DEFAULT_REAPER_INTERVAL_S = 5.0
DEFAULT_PRUNE_INTERVAL_S = 60.0
DEFAULT_COMPLETED_RETENTION_S = 3600.0  # completed rows kept an hour for inspection, then deleted
# failed, discarded, cancelled: a week for people to look at or retry
DEFAULT_FAILED_RETENTION_S = 604800.0
DEFAULT_HISTORY_RETENTION_S = 604800.0  # attempt history: a week
DEFAULT_PRUNE_BATCH = 1000  # rows per DELETE: ~2 ms at 500k rows, and no more row locks than that
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB: a job payload is a reference, not a blob store
DEFAULT_SYNC_THREADS = 8  # threads for sync handlers; async ones need none
# handlers' progress reports: a bar people watch moves every second, one statement per worker
DEFAULT_PROGRESS_FLUSH_S = 1.0
# A handler still running this long after its timeout fired ignores it (swallowed cancellation,
# a thread stuck in C code): it is stuck. Long enough for cleanup code that reacts to cancellation.
DEFAULT_STUCK_GRACE_S = 30.0
# A worker with a handler stuck this long exits (code 3) so that the process, and the handler with
# it, ends, and the job comes back by its lease; 5 min: long enough to rule out a slow cleanup.
DEFAULT_STUCK_EXIT_AFTER_S = 300.0
DEFAULT_COORDINATOR_LEASE_S = 10.0  # a dead worker's buckets move within this (+ ~0.1 s)
DEFAULT_COORDINATOR_POLL_S = 1.0  # membership re-read at least this often; NOTIFY/pub-sub is faster
DEFAULT_STEAL_BATCH = 100  # jobs taken per poll from other buckets when our own are idle
# a server that does not finish the handshake in 5 s is treated as down
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# Our statements take milliseconds (a claim of 500 about 10 ms at 200k queued); 5 s means the
# database or the path to it is stuck. Against the 30 s lease: a stalled heartbeat is noticed
# within heartbeat (10 s) + 5 s = half a lease, with time left before any lease runs out.
DEFAULT_STATEMENT_TIMEOUT_S = 5.0
# the loop ticks every 1 s; 10 s silent is a blocked loop, not a busy one
DEFAULT_LOOP_STALL_S = 10.0
# a common Prometheus scrape interval; one pod samples (table_sampler.py)
DEFAULT_TABLE_SAMPLE_INTERVAL_S = 15.0
# 32 characters of secrets.token_urlsafe: 192 bits, beyond guessing; the token's 16 is a floor
# for a password people type, this one only machines read
MIN_SESSION_SECRET = 32
MIN_WEB_TOKEN = 16
COORDINATORS = ("postgres", "redis", "static")
# The `redis` extra's requirement (pyproject.toml; a test keeps the two equal), named in the error
# that a Redis coordinator without redis-py gets.
REDIS_REQUIREMENT = "redis>=5.0"
LISTEN_OFF = "none"  # listen_dsn value: no LISTEN connection at all (polling only)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")  # see dispatcher/observe/logs.py
# DISPATCHER_REDIS_KEY_PREFIX: non-empty, no whitespace, no braces. A `{...}` in a key name is a
# Redis Cluster hash tag (it picks the key's slot). The backend talks to one server, not a Cluster;
# should it ever, each script touches several keys of one group at once, so one tag must wrap the
# group's whole prefix (`{<prefix>:<queue>}`): the backend's to place, never part of the user's
# setting.
REDIS_KEY_PREFIX_RE = re.compile(r"[^\s{}]+")
