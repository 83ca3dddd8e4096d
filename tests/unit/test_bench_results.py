"""bench/results/ holds the latest result of each scenario only, and RESULTS.md links to none
that is gone.

Older raw files live in git history (RESULTS.md names the commit); a dated copy beside the latest
would be read as current.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.__main__ import NAMED_ONLY, SCENARIOS

BENCH = Path(__file__).resolve().parents[2] / "bench"
RESULTS = BENCH / "results"


def test_one_json_per_scenario_named_after_it() -> None:
    files = sorted(p.name for p in RESULTS.glob("*.json"))
    named = [*SCENARIOS, *NAMED_ONLY]
    assert files == sorted(f"{s}.json" for s in named if (RESULTS / f"{s}.json").exists())
    assert files, "no result at all"
    for name in files:
        assert json.loads((RESULTS / name).read_text())["scenario"] == name.removesuffix(".json")


def test_only_json_and_the_plots_of_a_kept_scenario() -> None:
    kept = {p.stem for p in RESULTS.glob("*.json")}
    for path in RESULTS.iterdir():
        assert path.suffix in (".json", ".png"), path.name
        if path.suffix == ".png":
            assert any(path.stem == s or path.stem.startswith(f"{s}_") for s in kept), path.name


def test_every_link_of_results_md_into_results_exists() -> None:
    """Figures (`![...](results/x.png)`) and file names in code spans (`results/x.json`)."""
    text = (BENCH / "RESULTS.md").read_text()
    targets = re.findall(r"\]\((results/[^)\s]+)\)", text) + re.findall(
        r"`(results/[^`\s]+)`", text
    )
    assert any(t.endswith(".png") for t in targets), "RESULTS.md shows no figure"
    assert [t for t in targets if not (BENCH / t).is_file()] == []
