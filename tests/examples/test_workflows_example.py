"""A workflow, a batch and a result, run without PostgreSQL: a file to copy.

The same text is in docs/guides/workflows.md (tests/unit/test_workflows_guide.py keeps them equal).
"""

import pytest

from dispatcher import (
    JobFailed,
    JobSpec,
    PermanentJobError,
    Registry,
    Workflow,
    enqueue_batch_sync,
    enqueue_workflow_sync,
)
from dispatcher.testing import MemoryStore, Runner

# -- the application (yours lives in your own modules) ---------------------------------------------

registry = Registry()


@registry.handler("fetch_album")
def fetch_album(job) -> dict:
    return {"photos": job.payload["photos"]}  # stored with the job: its result


@registry.handler("thumbnail")
def thumbnail(job) -> str:
    if job.payload["n"] < 0:
        raise PermanentJobError("no such photo")
    return f"album-{job.payload['album']}/thumb-{job.payload['n']}.jpg"


@registry.handler("build_index")
def build_index(job) -> dict:
    return {"album": job.payload["album"], "indexed": True}


@registry.handler("notify_done")
def notify_done(job) -> dict:
    return job.payload["batch"]["counts"]  # what the batch's members came to


def process_album(db, album: int, photos: int) -> dict:
    """Fetch, then one thumbnail per photo in parallel, then the index once all are done. In
    production `db` is your pool or connection; in a unit test, a MemoryStore."""
    wf = Workflow()
    wf.add("fetch", "fetch_album", {"album": album, "photos": photos})
    thumbs = [
        wf.add(f"thumb-{n}", "thumbnail", {"album": album, "n": n}, after=["fetch"])
        for n in range(photos)
    ]
    wf.add("index", "build_index", {"album": album}, after=thumbs)
    return enqueue_workflow_sync(db, wf)


# -- the tests -------------------------------------------------------------------------------------


def test_the_index_runs_after_every_thumbnail_and_its_result_can_be_awaited():
    store = MemoryStore()
    ids = process_album(store, album=7, photos=3)
    runner = Runner(store, registry)
    runner.drain()
    order = [a.job_id for a in runner.attempts]
    assert order[0] == ids["fetch"] and order[-1] == ids["index"]
    assert ids["index"].result_sync(timeout=1) == {"album": 7, "indexed": True}
    assert ids["thumb-2"].result_sync(timeout=1) == "album-7/thumb-2.jpg"


def test_a_failed_thumbnail_cancels_the_index():
    store = MemoryStore()
    wf = Workflow()
    wf.add("bad", "thumbnail", {"album": 7, "n": -1})
    wf.add("index", "build_index", {"album": 7}, after=["bad"])
    ids = enqueue_workflow_sync(store, wf)
    Runner(store, registry).drain()
    with pytest.raises(JobFailed, match="discarded"):
        ids["bad"].result_sync(timeout=1)
    with pytest.raises(JobFailed, match="cancelled"):
        ids["index"].result_sync(timeout=1)


def test_a_batch_callback_gets_the_counts():
    store = MemoryStore()
    batch = enqueue_batch_sync(
        store,
        [JobSpec("thumbnail", {"album": 7, "n": n}) for n in (0, 1, -1)],
        callback=JobSpec("notify_done", {"user": 42}),
    )
    Runner(store, registry).drain()
    assert batch.batch_id.result_sync(timeout=1) == {
        "completed": 2,
        "failed": 0,
        "discarded": 1,
        "cancelled": 0,
    }
