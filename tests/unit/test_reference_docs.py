"""The generated pages of docs/reference/ match the code (dispatcher/cli/reference.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dispatcher.cli import reference
from dispatcher.settings import config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_generated_page_is_up_to_date(name: str) -> None:
    path = ROOT / reference.REFERENCE / name
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run `{reference.COMMAND}`"
    assert path.read_text(encoding="utf-8") == reference.PAGES[name](), (
        f"{path.relative_to(ROOT)} is out of date: run `{reference.COMMAND}`"
    )


def test_stale_names_a_page_that_differs(tmp_path: Path) -> None:
    pages = tmp_path / reference.REFERENCE
    pages.mkdir(parents=True)
    for name, render in reference.PAGES.items():
        (pages / name).write_text(render(), encoding="utf-8")
    assert reference.stale(tmp_path) == []
    (pages / "cli.md").write_text("old text", encoding="utf-8")
    (pages / "metrics.md").unlink()
    assert reference.stale(tmp_path) == [pages / "cli.md", pages / "metrics.md"]


def test_configuration_lists_every_setting_once_with_its_default() -> None:
    text = reference.configuration()
    for s in config.settings():
        rows = [line for line in text.splitlines() if line.startswith(f"| `{s.env_var}` |")]
        assert len(rows) == 1, s.env_var
        assert f"| {s.default_text} |" in rows[0], s.env_var


@dataclasses.dataclass(frozen=True)
class _Sectioned:
    env_var: str
    default_text: str
    help: str
    section: str | None


def test_configuration_is_grouped_by_section_when_settings_have_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = (
        _Sectioned("DISPATCHER_A", "1", "a | b", "Claims"),
        _Sectioned("DISPATCHER_B", "2", "b", "Leases"),
        _Sectioned("DISPATCHER_C", "3", "c", "Claims"),
    )
    monkeypatch.setattr(config, "settings", lambda: fake)
    text = reference.configuration()
    claims, leases = text.index("\n## Claims\n"), text.index("\n## Leases\n")
    assert (
        claims
        < text.index("`DISPATCHER_A`")
        < text.index("`DISPATCHER_C`")
        < leases
        < text.index("`DISPATCHER_B`")
    )
    assert "| a \\| b |" in text  # a pipe in help text does not split the cell
    assert "## Settings" not in text


def test_metrics_found_in_the_source_include_counters_families_and_labels(tmp_path: Path) -> None:
    (tmp_path / "dispatcher").mkdir()
    (tmp_path / "coordinator" / "devtools").mkdir(parents=True)
    (tmp_path / "dispatcher" / "m.py").write_text(
        'A = Counter("dispatcher_a", "Things counted", ["queue"])\n'
        'B = Gauge("other_b", "not ours")\n'
        "def f():\n"
        '    return GaugeMetricFamily("dispatcher_c", "A " "gauge", labels=["x", "y"])\n'
        'H = Histogram("h_seconds", "test only", registry=None)\n',
        encoding="utf-8",
    )
    (tmp_path / "coordinator" / "devtools" / "skip.py").write_text(
        'Gauge("dispatcher_d", "devtools")\n'
    )
    assert reference.metric_definitions(tmp_path) == [
        ("dispatcher_a_total", "counter", ["queue"], "Things counted", "dispatcher/m.py"),
        ("dispatcher_c", "gauge", ["x", "y"], "A gauge", "dispatcher/m.py"),
    ]


def test_every_metric_of_the_live_registry_is_in_the_reference() -> None:
    # Importing the modules registers their metrics; whatever dispatcher_* family the registry
    # describes must be on the page (a metric defined in a way the generator misses fails here).
    from prometheus_client import REGISTRY

    import coordinator.metrics  # noqa: F401  (imported to register its metrics)
    import dispatcher.observe.job_metrics
    import dispatcher.observe.metrics
    import dispatcher.runtime.table_sampler
    import dispatcher.serve.health  # noqa: F401  (likewise)

    page = reference.metrics()
    names = {
        m.name
        for c in list(REGISTRY._collector_to_names)
        for m in getattr(c, "describe", list)()
        if m.name.startswith("dispatcher_")
    }
    assert names
    for name in names:  # a counter's family is named without its _total
        assert f"`{name}`" in page or f"`{name}_total`" in page, (
            f"{name} is missing from the metrics reference"
        )
