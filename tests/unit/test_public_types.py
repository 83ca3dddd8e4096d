"""The public API says what it takes: a type checker sees a decorated handler's own signature,
and catches a misspelt or mistyped enqueue option and an unknown on_ordered_failure.

mypy --strict runs on a small user module (below); each line marked `# E: code` must get exactly
that error, and no other line any.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import mypy.api

REPO = Path(__file__).resolve().parents[2]

USER_MODULE = """\
from typing import Any

import psycopg

from dispatcher import Job, Registry, enqueue, enqueue_payloads, enqueue_sync

registry = Registry()


@registry.handler("send_email", timeout_s=30)
async def send_email(job: Job, *, dry_run: bool = False) -> str:
    return "sent"


@registry.handler("resize", on_ordered_failure="continue")
def resize(job: Job) -> None:
    pass


reveal_type(send_email)  # R: def (job: dispatcher.model.Job, *, dry_run: bool =) -> \
typing.Coroutine[Any, Any, str]
reveal_type(resize)  # R: def (job: dispatcher.model.Job)


async def main(conn: psycopg.AsyncConnection[Any], sync: psycopg.Connection[Any]) -> None:
    await enqueue(conn, "send_email", {"to": "a@example.com"}, queue="emails", priority=1)
    await enqueue(conn, "send_email", None, queu="emails")  # E: call-arg
    await enqueue(conn, "send_email", None, priority="high")  # E: arg-type
    enqueue_sync(sync, "send_email", None, delay_s="soon")  # E: arg-type
    await enqueue_payloads(conn, "send_email", [{}], partition_keys=["a"])
    await enqueue_payloads(conn, "send_email", [{}], dedupe_key="x")  # E: call-arg
    registry.handler("other", on_ordered_failure="stop")  # E: arg-type
"""


def test_a_type_checker_sees_what_the_public_api_takes(tmp_path: Path) -> None:
    source = USER_MODULE.replace("\\\n", "")
    user = tmp_path / "user_app.py"
    user.write_text(source, encoding="utf-8")
    os.environ.setdefault("MYPYPATH", str(REPO))  # the editable install's finder is not mypy's
    out, err, _ = mypy.api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(user),
        ]
    )
    assert not err, err
    found: dict[int, list[str]] = {}
    for line in out.splitlines():
        m = re.match(rf"{re.escape(str(user))}:(\d+): (error|note): (.*)", line)
        assert m, f"mypy reported outside the user module: {line}"
        found.setdefault(int(m[1]), []).append(f"{m[2]}: {m[3]}")

    expected: dict[int, str] = {}
    for number, text in enumerate(source.splitlines(), start=1):
        if "# E: " in text:
            expected[number] = f"[{text.split('# E: ')[1]}]"
        elif "# R: " in text:
            expected[number] = f'Revealed type is "{text.split("# R: ")[1]}"'
    for number, want in expected.items():
        got = [f for f in found.get(number, []) if not f.endswith("defined in")]
        assert any(want in f for f in got), f"line {number}: want {want!r}, got {got}"
    unexpected = {n: f for n, f in found.items() if n not in expected}
    assert not unexpected, f"mypy also reported: {unexpected}"
