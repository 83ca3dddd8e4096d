"""docs/guides/testing.md shows tests/examples/test_handlers_example.py whole: the two stay
equal."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "testing.md"
EXAMPLE = REPO / "tests" / "examples" / "test_handlers_example.py"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.DOTALL | re.MULTILINE)


def test_the_guide_shows_the_example_file_as_it_is() -> None:
    example = EXAMPLE.read_text(encoding="utf-8")
    blocks = python_blocks(GUIDE.read_text(encoding="utf-8"))
    named = [b for b in blocks if "tests/unit/test_testing_guide.py" in b]
    assert len(named) == 1, "one block of the guide is the example file"
    assert named[0] == example, (
        "edit both: docs/guides/testing.md's example and tests/examples/test_handlers_example.py"
    )


def test_the_guides_snippets_name_only_what_dispatcher_testing_exports() -> None:
    import dispatcher.testing

    text = GUIDE.read_text(encoding="utf-8")
    imported = re.findall(r"from dispatcher\.testing import ([\w, ]+)", text)
    names = {n.strip() for line in imported for n in line.split(",")}
    assert names and names <= set(dispatcher.testing.__all__)
