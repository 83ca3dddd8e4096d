"""Connection strings in messages: say which server, never the password.

libpq quotes parts of the DSN in its errors (a bad percent-escape, the whole URI), so every
message about connecting goes through `redact()` or `one_line()`, which blanks each form the
password can take.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import psycopg

REDACTED = "***"

# Where a password sits in a DSN's text, parsable or not (libpq's own grammar):
# - a URI's user info: after the first ':' and up to the first '@' before any '/';
_URI_PASSWORD = re.compile(r"^\s*postgres(?:ql)?://[^@/:]*:([^@/]*)@", re.IGNORECASE)
# - a URI's query parameter `password=...`;
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)", re.IGNORECASE)
# - a key=value string's `password=value` or `password='quoted \' value'`.
_KEYWORD_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:\\.|[^'\\])*'?|\S*)", re.IGNORECASE)


def describe_dsn(dsn: str) -> str:
    """user@host:port/dbname: enough to tell which server, never the password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    user = f"{info['user']}@" if info.get("user") else ""
    return f"{user}{host}:{port}/{info.get('dbname') or ''}"


def password_forms(dsn: str) -> list[str]:
    """Every spelling of the DSN's password a message may quote: as written, unquoted,
    percent-decoded, and as libpq parsed it. Longest first, so a longer form is blanked whole."""
    forms: set[str] = set()
    raw = [
        m.group(1) for pattern in (_URI_PASSWORD, _QUERY_PASSWORD) for m in pattern.finditer(dsn)
    ]
    for m in _KEYWORD_PASSWORD.finditer(dsn):
        token = m.group(1)
        raw.append(token)
        if token.startswith("'"):
            raw.append(re.sub(r"\\(.)", r"\1", token.strip("'")))
    for token in raw:
        forms.update((token, unquote(token)))
    try:
        parsed = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        parsed = None
    if parsed:
        forms.add(str(parsed))
    forms.discard("")
    return sorted(forms, key=len, reverse=True)


def redact(text: str, dsn: str | None) -> str:
    """`text` with every form of `dsn`'s password replaced by ***. A very short password may
    blank harmless letters elsewhere in the text too: a garbled word is better than a leak."""
    if not dsn:
        return text
    for form in password_forms(dsn):
        text = text.replace(form, REDACTED)
    return text


def one_line(exc: BaseException | str, dsn: str | None) -> str:
    """A psycopg error as one line: libpq's connection prefix up to `FATAL:` dropped (the caller
    names the server), whitespace collapsed, the password redacted."""
    text = str(exc)
    if "FATAL:" in text:
        text = text[text.index("FATAL:") + len("FATAL:") :]
    return redact(" ".join(text.split()), dsn)


# Passwords in any text, whoever wrote it (the last line of defence in the log formatter, which
# cannot know every DSN a message may quote): a URI's user info `scheme://user:PASS@` (greedy to
# the token's last '@', as urllib splits it: an unencoded '@' in a password is still covered), and
# `password=PASS` / `password: PASS` / `'password': 'PASS'` key-values, quoted or not.
_ANY_URI_PASSWORD = re.compile(r"""(\b[a-z][a-z0-9+.-]*://[^\s:/@'"]*:)[^\s'"]*@""", re.IGNORECASE)
_ANY_KEY_PASSWORD = re.compile(
    r"""(\b(?:password|passwd|pwd)['"]?\s*[=:]\s*)('(?:\\.|[^'\\])*'?|"(?:\\.|[^"\\])*"?|[^\s&,;'"]+)""",
    re.IGNORECASE,
)


# what both patterns need: one search to rule out
_MAYBE_PASSWORD = re.compile(r"://|pass|pwd", re.IGNORECASE)


def scrub(text: str) -> str:
    """`text` with every password written in a URI's user info or as a `password=` key-value
    replaced by ***, whichever DSN or URL it came from. One search when there is none."""
    if not _MAYBE_PASSWORD.search(text):
        return text
    if "://" in text:
        text = _ANY_URI_PASSWORD.sub(rf"\1{REDACTED}@", text)
    return _ANY_KEY_PASSWORD.sub(rf"\1{REDACTED}", text)


def redis_url_problem(url: str) -> str | None:
    """Why redis-py cannot parse `url` (redacted), or None if it can. Parsing only: no connection.
    Else the worker would meet it at start as a traceback."""
    from redis.connection import parse_url  # only where a Redis URL is set: ~0.1 s of imports

    try:
        parse_url(url)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    except ValueError as exc:
        text = scrub(str(exc))
        password = urlsplit_password(url)
        for form in (
            sorted({password, unquote(password)}, key=len, reverse=True) if password else ()
        ):
            text = text.replace(form, REDACTED)
        return text
    return None


def urlsplit_password(url: str) -> str | None:
    """The password of a URL's user info as written (not percent-decoded), or None."""
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def dsn_problem(dsn: str) -> str | None:
    """Why libpq cannot parse `dsn` (redacted), or None if it can. Parsing only: no connection."""
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        return one_line(exc, dsn)
    return None
