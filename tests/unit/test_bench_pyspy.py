"""bench --py-spy: py-spy's raw stacks become CPU per job by function (own time)."""

from bench.pyspy import own_time, top

RAW = (
    "<module> (dispatcher/__main__.py:5);run (asyncio/runners.py:118);Producer._claim "
    "(dispatcher/runtime/producer.py:256) 30\n<module> (dispatcher/__main__.py:5);run "
    "(asyncio/runners.py:118);Producer._claim (dispatcher/runtime/producer.py:260) 10\n<module> "
    "(dispatcher/__main__.py:5);run (asyncio/runners.py:118) 50\n<module> "
    "(dispatcher/__main__.py:5);Completer.flush (dispatcher/runtime/completer.py:130) 10\nnot a "
    "sample line\n"
)


def test_samples_count_for_the_innermost_function_whatever_its_line():
    assert own_time(RAW) == {
        "Producer._claim (dispatcher/runtime/producer.py)": 40,
        "run (asyncio/runners.py)": 50,
        "Completer.flush (dispatcher/runtime/completer.py)": 10,
    }


def test_top_spreads_the_client_cpu_per_job_by_share():
    rows = top(RAW, client_us_per_job=5.0, n=2)
    assert rows == [
        {"function": "run (asyncio/runners.py)", "share": 0.5, "us_per_job": 2.5},
        {
            "function": "Producer._claim (dispatcher/runtime/producer.py)",
            "share": 0.4,
            "us_per_job": 2.0,
        },
    ]
    assert top("", client_us_per_job=5.0) == []
