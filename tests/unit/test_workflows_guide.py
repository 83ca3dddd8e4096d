"""docs/guides/workflows.md shows tests/examples/test_workflows_example.py whole: the two stay
equal."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_testing_guide import python_blocks

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "workflows.md"
EXAMPLE = REPO / "tests" / "examples" / "test_workflows_example.py"


def test_the_guide_shows_the_example_file_as_it_is() -> None:
    example = EXAMPLE.read_text(encoding="utf-8")
    blocks = python_blocks(GUIDE.read_text(encoding="utf-8"))
    named = [b for b in blocks if "tests/unit/test_workflows_guide.py" in b]
    assert len(named) == 1, "one block of the guide is the example file"
    assert named[0] == example, (
        "edit both: docs/guides/workflows.md's example and tests/examples/test_workflows_example.py"
    )
