"""One reading of an HTTP request target, done once, before authentication and routing.

Issue 15: `/%61pi/v1/queues` used to skip authentication because the auth check looked
at the raw path and the router at a decoded one. Here every spelling becomes one
`Target` (decoded segments plus the query); the handler authenticates and routes on it
and on nothing else.

Rules (RFC 3986 section 6 normalisation, strict where a spelling is ambiguous):
- origin-form `/path?query` and absolute-form `http://host/path?query` (scheme and host
  case-insensitive, the host ignored); `*` and authority-form are refused.
- refused outright (400): control characters and NUL, spaces, non-ASCII bytes, `#`
  (a fragment is never sent by a client), a raw backslash (some proxies read it as `/`),
  a malformed `%` escape, escapes that do not decode as strict UTF-8 (overlong forms
  such as `%C0%AF` included), a decoded control character, `..` above the root.
- the path is split on `/` first and each segment decoded after, so `%2F` stays a
  literal character of its segment (a queue named `a/b` is `/api/v1/queues/a%2Fb`).
- empty segments (`//`, a trailing `/`) and `.` are dropped, `..` drops the previous
  segment; `%2E` is `.` (RFC 3986 decodes unreserved characters before removing dots).
- segments are case-sensitive (queue names are): `/API/v1/queues` is another path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote_to_bytes

MAX_QUERY_FIELDS = 50
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ABSOLUTE = re.compile(r"^https?://([^/?#]+)(.*)$", re.IGNORECASE)


class BadTarget(ValueError):
    """The request target cannot be read one way only: answered 400, before auth."""


@dataclass(frozen=True, slots=True)
class Target:
    """A request target as the broker understands it."""

    segments: tuple[str, ...]
    query: dict[str, list[str]]

    @property
    def path(self) -> str:
        """The normalised path, for messages and logs."""
        return "/" + "/".join(self.segments)


def parse_target(raw: str) -> Target:
    """Normalise `raw` (the request line's target, as `http.server` read it)."""
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in raw):
        raise BadTarget("control characters, spaces or non-ASCII bytes in the request target")
    if "#" in raw:
        raise BadTarget("a fragment ('#') in the request target")
    if "\\" in raw:
        raise BadTarget("a backslash in the request target")
    if raw.startswith("/"):
        rest = raw
    elif absolute := _ABSOLUTE.match(raw):
        rest = absolute.group(2) or "/"
        if not rest.startswith(("/", "?")):
            raise BadTarget("the request target is not a path")
    else:
        raise BadTarget("the request target is not a path")
    path, _, query = rest.partition("?")
    segments: list[str] = []
    for raw_segment in path.split("/"):
        segment = _decode(raw_segment)
        if segment in ("", "."):
            continue
        if segment == "..":
            if not segments:
                raise BadTarget("'..' above the root")
            segments.pop()
            continue
        segments.append(segment)
    return Target(tuple(segments), _query(query))


def _decode(raw: str) -> str:
    if _BAD_ESCAPE.search(raw):
        raise BadTarget("a malformed %-escape in the request target")
    try:
        text = unquote_to_bytes(raw).decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise BadTarget("%-escapes that are not UTF-8 in the request target") from None
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise BadTarget("an escaped control character in the request target")
    return text


def _query(raw: str) -> dict[str, list[str]]:
    if _BAD_ESCAPE.search(raw):
        raise BadTarget("a malformed %-escape in the query")
    try:
        return parse_qs(
            raw, keep_blank_values=True, errors="strict", max_num_fields=MAX_QUERY_FIELDS
        )
    except UnicodeDecodeError:
        raise BadTarget("%-escapes that are not UTF-8 in the query") from None
    except ValueError:
        raise BadTarget(f"more than {MAX_QUERY_FIELDS} query fields") from None
