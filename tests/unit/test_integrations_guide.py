"""docs/guides/integrations.md shows every file of docs/examples/ whole: the two stay equal.

Each example file starts with a comment naming its path in the reader's project (`# shop/jobs.py`);
the guide's block that starts with that line must be the file, character for character.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "integrations.md"
EXAMPLES = REPO / "docs" / "examples"
PROJECTS = [EXAMPLES / "django_app", EXAMPLES]  # where each example's paths start


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.DOTALL | re.MULTILINE)


def example_files() -> dict[str, str]:
    """'# path' header -> the file's text, for every non-empty .py file under docs/examples/."""
    files: dict[str, str] = {}
    for path in sorted(EXAMPLES.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not text:
            continue  # a package's empty __init__.py
        root = next(p for p in PROJECTS if path.is_relative_to(p))
        header = f"# {path.relative_to(root).as_posix()}"
        assert text.startswith(header + "\n"), f"{path} starts with {header!r}"
        files[header] = text
    return files


def test_every_example_file_is_in_the_guide_as_it_is() -> None:
    blocks = python_blocks(GUIDE.read_text(encoding="utf-8"))
    files = example_files()
    assert len(files) >= 6
    for header, text in files.items():
        shown = [b for b in blocks if b.startswith(header + "\n")]
        assert len(shown) == 1, f"one block of {GUIDE.name} shows {header[2:]}"
        assert shown[0] == text, (
            f"edit both: {GUIDE.name}'s block and docs/examples/.../{header[2:]}"
        )


def test_every_file_the_guide_names_exists() -> None:
    files = example_files()
    for block in python_blocks(GUIDE.read_text(encoding="utf-8")):
        first = block.split("\n", 1)[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            assert first in files, (
                f"{GUIDE.name} shows {first[2:]}, which is not under docs/examples/"
            )
