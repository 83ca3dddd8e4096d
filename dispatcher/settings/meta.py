"""How a Config field is declared and shown: `setting(...)` (default, parser, help, unit), the
parsers of env var and flag text, and `Setting`, a field as the CLI and the reference docs present
it. The rules a value must follow are in rules.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dispatcher.errors import ConfigError
from dispatcher.settings.sections import SECTIONS


def parse_buckets(text: str) -> tuple[int, ...]:
    """'0-15,32,40-41' -> (0, ..., 15, 32, 40, 41). Raises ValueError on bad syntax."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi < lo:
                raise ValueError(f"range {part!r} runs backwards")
            out.update(range(lo, hi + 1))
        else:
            out.add(int(part))
    return tuple(sorted(out))


def parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def parse_queues(text: str) -> tuple[str, ...]:
    return tuple(q.strip() for q in text.split(",") if q.strip())


# What a value of each parser's result must be when a Config is built directly (no text parsed).
# bool is an int, so ints accept bools; that is not worth a rule.
KINDS: dict[Callable[[str], Any], tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    parse_bool: (bool,),
    parse_queues: (tuple,),
    parse_buckets: (tuple,),
}
_META_KEY = "dispatcher.setting"


@dataclasses.dataclass(frozen=True, slots=True)
class _Meta:
    parse: Callable[[str], Any]
    help: str
    unit: str | None
    shown: str | None
    section: str


def setting(
    default: Any = dataclasses.MISSING,
    *,
    section: str,
    parse: Callable[[str], Any],
    help: str,
    unit: str | None = None,
    shown: str | None = None,
    secret: bool = False,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A Config field: its section, default, the parser for its env var / flag text, what it
    does, its unit.

    `help` says what the setting does, with its unit, but not its default (that is appended from
    the field, or from `shown` where the default is computed or None means something). `section`
    (sections.py) is the component that reads it. A `secret` is left out of the Config's repr.
    """
    if parse not in KINDS:
        raise TypeError(f"setting(): no value rule for parser {parse!r}; add it to KINDS")
    if section not in SECTIONS:
        raise TypeError(f"setting(): unknown section {section!r}; one of {', '.join(SECTIONS)}")
    meta = {_META_KEY: _Meta(parse, help, unit, shown, section)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta, repr=not secret)
    return dataclasses.field(default=default, metadata=meta, repr=not secret)


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One Config field as the outside world sees it (env var, flag, help). From `settings()`."""

    name: str  # field name: "lease_s"
    env_var: str  # "DISPATCHER_LEASE_S"
    flag: str  # "--lease-s"
    parse: Callable[[str], Any]  # text -> value; raises ValueError on bad text
    help: str  # what it does, with its unit, without the default
    unit: str | None  # "seconds", "bytes", "jobs", ... or None
    # the dataclass default; None where it is computed at construction (see default_text)
    default: Any
    default_text: str  # the default as documented: "30", "partitioned", "lease_s / 3"
    section: str  # the component that reads it: "claims", "leases", ... (sections.SECTIONS)

    @property
    def description(self) -> str:
        """Help text with the default: what `dispatcher run --help` prints."""
        return f"{self.help} (default {self.default_text})"


def show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def setting_of(field: dataclasses.Field[Any], env_prefix: str) -> Setting:
    meta: _Meta = field.metadata[_META_KEY]
    default = None if field.default is dataclasses.MISSING else field.default
    return Setting(
        name=field.name,
        env_var=env_prefix + field.name.upper(),
        flag="--" + field.name.replace("_", "-"),
        parse=meta.parse,
        help=meta.help,
        unit=meta.unit,
        default=default,
        default_text=meta.shown if meta.shown is not None else show(default),
        section=meta.section,
    )


def parse_text(s: Setting, raw: str, origin: str) -> Any:
    """A setting's env var or flag text parsed; ConfigError naming `origin` if it cannot be."""
    try:
        return s.parse(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(origin, f"cannot parse {raw!r}: {exc}") from None
