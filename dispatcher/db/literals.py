"""Array parameters as text literals, for the statements that send thousands of ids at a time."""

from __future__ import annotations

from collections.abc import Sequence


def int_array(values: Sequence[int]) -> str:
    """A bigint[] as a text literal. psycopg's list dumper is pure Python and took a fifth of a
    worker's CPU for the ids of every flush; str.join runs in C (cast with ::bigint[] in SQL)."""
    return "{" + ",".join(map(str, values)) + "}"


def tag_array(tags: Sequence[str] | None) -> str | None:
    """A job's tags as a text[] literal (None: NULL), each quoted: checked at enqueue to hold no
    quote, backslash, brace, comma or space (api/enqueue_checks.py), and a bare NULL would read
    as a null element."""
    return None if tags is None else "{" + ",".join(f'"{t}"' for t in tags) + "}"


def token_array(tokens: Sequence[str]) -> str:
    """A uuid[] text literal from claim tokens (already canonical uuid strings: no quoting
    needed)."""
    return "{" + ",".join(tokens) + "}"
