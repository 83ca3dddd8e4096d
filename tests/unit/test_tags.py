"""Tags without a server: what enqueue accepts, the COPY rows with and without them (a job without
tags adds one NULL column, nothing else), the array literal, the admin's filter, typed tasks'
options, and the in-memory store. tests/integration/test_tags.py proves the paths on PostgreSQL."""

from datetime import UTC, datetime

import pytest

from dispatcher import JobSpec, Registry, enqueue_payloads_sync, enqueue_sync
from dispatcher.admin import AdminInputError, Filters
from dispatcher.api.enqueue_checks import MAX_TAGS, check_tags
from dispatcher.api.enqueue_copy import CopyTally, copy_chunks
from dispatcher.api.enqueue_prepare import _prepare_all
from dispatcher.db.literals import tag_array
from dispatcher.errors import EnqueueError
from dispatcher.testing import MemoryStore

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_tags_are_kept_in_order_without_duplicates_and_none_or_empty_is_no_tags() -> None:
    assert check_tags(["b", "a", "b", "c.d:e-f_9"]) == ("b", "a", "c.d:e-f_9")
    assert check_tags(("x",)) == ("x",)
    assert check_tags(t for t in ["g", "g"]) == ("g",)
    assert check_tags(None) is None and check_tags([]) is None
    assert check_tags(["t"] * 40) == ("t",), "duplicates do not count towards the bound"
    assert len(check_tags([f"t{i}" for i in range(MAX_TAGS)]) or ()) == MAX_TAGS


@pytest.mark.parametrize(
    ("tags", "said"),
    [
        ("urgent", "a list of strings, got str"),
        (b"urgent", "a list of strings, got bytes"),
        (3, "a list of strings, got int"),
        (["ok", ""], "got ''"),
        (["a b"], "got 'a b'"),
        (["a,b"], "got 'a,b'"),
        (["{x}"], "got '{x}'"),
        (['"'], "got '\"'"),
        (["\\"], "got '\\\\'"),
        (["é"], "got 'é'"),
        (["x" * 65], "got 'xxx"),
        ([None], "got None"),
        ([["nested"]], "got ['nested']"),
        ([f"t{i}" for i in range(MAX_TAGS + 1)], f"at most {MAX_TAGS} tags, got {MAX_TAGS + 1}"),
    ],
)
def test_a_bad_tag_is_refused_naming_tags(tags: object, said: str) -> None:
    with pytest.raises(EnqueueError) as refused:
        check_tags(tags)
    assert refused.value.option == "tags" and said in str(refused.value), str(refused.value)


def test_the_array_literal_quotes_each_tag_so_a_tag_named_null_stays_a_string() -> None:
    assert tag_array(("a", "NULL")) == '{"a","NULL"}'
    assert tag_array(None) is None


def _lines(specs: list[JobSpec], staged: bool = False) -> list[list[str]]:
    chunks = copy_chunks(_prepare_all(specs, 1000), NOW, CopyTally(), staged)
    return [line.split("\t") for line in b"".join(chunks).decode().splitlines()]


def test_a_copy_row_ends_with_its_tags_or_null_before_the_trace() -> None:
    plain, tagged, again = _lines(
        [
            JobSpec("t", bucket=1),
            JobSpec("t", bucket=2, tags=["a", "b"]),
            JobSpec("t", tags=["a", "b"]),
        ]
    )
    # queue, type, payload, priority, bucket, max_attempts, given, run_at, dedupe_key, tags
    assert plain == ["default", "t", "{}", "0", "1", "20", "f", NOW.isoformat(), "\\N", "\\N"]
    assert tagged[-1] == '{"a","b"}' == again[-1] and len(tagged) == 10
    trace = copy_chunks(
        _prepare_all([JobSpec("t", tags=["a"])], 1000), NOW, CopyTally(), False, b"T"
    )
    assert b"".join(trace).decode().rstrip("\n").split("\t")[-2:] == ['{"a"}', "T"]
    # staged: ... dedupe_key, ordering_key, dedupe_window_s, tags
    (staged,) = _lines([JobSpec("t", ordering_key="k", tags=["z"])], staged=True)
    assert staged[-4:] == ["\\N", "k", "\\N", '{"z"}']


def test_a_filter_takes_tags_as_an_array_and_refuses_a_bad_one() -> None:
    assert Filters(tags=("a", "b")).params()["tags"] == '{"a","b"}'
    assert Filters().params()["tags"] is None
    for bad in (("a b",), ("",), (1,)):
        with pytest.raises(AdminInputError) as refused:
            Filters(tags=bad)
        assert refused.value.option == "tags"


def test_a_typed_task_takes_tags_among_its_options() -> None:
    registry = Registry()

    @registry.task()
    def notify(user: int) -> None: ...

    tagged = notify.with_options(tags=["beta"])
    assert tagged.spec(1).tags == ["beta"]
    store = MemoryStore()
    job_id = tagged.enqueue_sync(store, 7)
    assert job_id is not None and (job := store.get(job_id)) is not None and job.tags == ["beta"]
    with pytest.raises(EnqueueError):
        notify.with_options(tags=["no good"]).enqueue_sync(store, 8)


def test_the_memory_store_keeps_the_tags_of_every_enqueue() -> None:
    store = MemoryStore()
    one = enqueue_sync(store, "t", tags=["a", "a", "b"])
    bare = enqueue_sync(store, "t")
    assert enqueue_payloads_sync(store, "p", [1, 2], tags=["shared"]) == 2
    tags = {j.id: j.tags for j in store.jobs()}
    assert tags[one] == ["a", "b"] and tags[bare] is None
    assert [j.tags for j in store.jobs(job_type="p")] == [["shared"], ["shared"]]
    with pytest.raises(EnqueueError):
        enqueue_payloads_sync(store, "p", [3], tags=["a b"])
    assert len(store.jobs()) == 4
