"""The README stays short and teaches first; its links, and those of docs/, lead somewhere."""

from __future__ import annotations

import re
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_BYTES = 12 * 1024
# Written on other branches of the same change; a link to them is fine before they land.
ELSEWHERE = {"docs/guides/testing.md", "docs/design/connection-errors.md"}
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_at_most_12_kib() -> None:
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, (
        f"README.md is {size} bytes, over {MAX_README_BYTES}: move detail into docs/ "
        "(docs/README.md says where)"
    )


def test_readme_keeps_the_test_command_ci_runs() -> None:
    assert re.search(r"^make test +# ", README.read_text(encoding="utf-8"), re.MULTILINE)


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose target file does not exist."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        if not resolved.exists() and not any(resolved == ROOT / other for other in ELSEWHERE):
            broken.append(target)
    return broken


def test_links_of_the_readme_and_docs_resolve() -> None:
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(pages) > 10
    broken = {
        page.relative_to(ROOT).as_posix(): links for page in pages if (links := broken_links(page))
    }
    assert not broken, f"links to nothing: {broken}"


def test_broken_links_finds_a_missing_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "[a](page.md) [b](missing.md#x) [c](https://example.com) [d](#top)\n"
        "```sh\n[e](not-a-link.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["missing.md#x"]


def test_the_readme_handlers_register() -> None:
    block = re.search(
        r"```python\n(# myapp/jobs.py\n.*?)```", README.read_text(encoding="utf-8"), re.DOTALL
    )
    assert block, "no myapp/jobs.py sample in the README"
    module = types.ModuleType("myapp_jobs")
    exec(compile(block[1], "README.md", "exec"), module.__dict__)
    assert module.registry.job_types() == ["resize_image", "send_email"]
    assert (
        module.registry.get("send_email").is_async
        and not module.registry.get("resize_image").is_async
    )
