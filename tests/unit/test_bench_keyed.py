"""The pure parts of `python -m bench keyed` (bench/keyed.py): the key mixes, the order check
from the handlers' recording, and the ratios between rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.keyed import add_ratios, key_mix, order_check, read_recording
from bench.keyed_app import NO_KEY


def test_the_mixes_have_their_key_counts_and_are_the_same_every_time() -> None:
    assert key_mix("none", 100) is None
    uniform = key_mix("keys1000", 20_000)
    assert uniform is not None and len(uniform) == 20_000 and len(set(uniform)) == 1000
    assert len(set(key_mix("hot50", 5_000) or [])) == 50
    assert key_mix("skewed", 1_000) == key_mix("skewed", 1_000)
    with pytest.raises(ValueError, match="unknown key mix"):
        key_mix("hot5", 10)


def test_the_skewed_mix_puts_most_jobs_on_a_few_keys() -> None:
    counts = Counter(key_mix("skewed", 100_000))
    top = [n for _, n in counts.most_common()]
    # 80/20 over 1,000 keys: the top 200 hold ~80%, and no key more than ~0.5%.
    assert len(counts) == 1000
    assert 0.78 < sum(top[:200]) / 100_000 < 0.82
    assert top[0] / 100_000 < 0.006 and top[-1] > 0


def test_jobs_of_a_key_one_after_the_other_in_id_order_pass() -> None:
    runs = [(1, "a", 0, 10), (2, "b", 5, 6), (3, "a", 10, 20), (4, "a", 25, 30), (5, None, 0, 1)]
    check = order_check(runs, jobs=5)
    assert check == {
        "order_ok": True,
        "order_violations": 0,
        "ran_twice": 0,
        "not_run": 0,
        "keys": 2,
        "top_key_jobs": 3,
    }


def test_overlap_out_of_order_a_job_twice_or_one_missing_fail() -> None:
    overlap = [(1, "a", 0, 10), (2, "a", 9, 12)]
    assert order_check(overlap, jobs=2)["order_violations"] == 1
    out_of_order = [(1, "a", 20, 30), (2, "a", 0, 10)]  # the later id ran first
    assert order_check(out_of_order, jobs=2)["order_ok"] is False
    twice = [(1, "a", 0, 10), (2, "a", 20, 30), (2, "a", 40, 50)]
    assert order_check(twice, jobs=2) | {"order_violations": 0} == {
        "order_ok": False,
        "order_violations": 0,
        "ran_twice": 1,
        "not_run": 0,
        "keys": 1,
        "top_key_jobs": 3,
    }
    missing = order_check([(1, "a", 0, 10)], jobs=2)
    assert missing["order_ok"] is False and missing["not_run"] == 1


def test_without_keys_there_is_no_order_to_check_but_runs_still_count() -> None:
    check = order_check([(1, None, 0, 1), (2, None, 0, 1), (2, None, 3, 4)], jobs=3)
    assert check["order_ok"] is None and check["ran_twice"] == 1 and check["not_run"] == 1


def test_the_recording_reads_back_as_written(tmp_path: Path) -> None:
    (tmp_path / "11.tsv").write_text(f"1\tk7\t100\t200\n2\t{NO_KEY}\t150\t160\n")
    (tmp_path / "12.tsv").write_text("")
    assert list(read_recording(tmp_path)) == [(1, "k7", 100, 200), (2, None, 150, 160)]


def test_ratios_are_to_the_keyless_row_and_to_skip_locked_of_the_same_mix_and_workers() -> None:
    rows = [
        {"mix": mix, "mode": mode, "workers": w, "due_jobs_per_s": rate}
        for (mix, mode, w, rate) in [
            ("none", "partitioned", 4, 1000),
            ("none", "skip_locked", 4, 800),
            ("hot50", "partitioned", 4, 500),
            ("hot50", "skip_locked", 4, 400),
            ("hot50", "partitioned", 8, 300),
        ]
    ]
    add_ratios(rows)
    none_p, _none_s, hot_p, hot_s, hot_p8 = rows
    assert "vs_none" not in none_p and none_p["vs_skip_locked"] == 1.25
    assert hot_p["vs_none"] == 0.5 and hot_s["vs_none"] == 0.5 and hot_p["vs_skip_locked"] == 1.25
    assert "vs_skip_locked" not in hot_s
    # no row of its workers to divide by
    assert "vs_none" not in hot_p8 and "vs_skip_locked" not in hot_p8
