"""Hostile inputs shared by the unit and integration tests (issue 15)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from amqpbroker.amqp import sections


def _escape_all(path: str) -> str:
    return "/".join("".join(f"%{ord(c):02X}" for c in seg) for seg in path.split("/"))


# Spellings of one path that every HTTP client or proxy may send; all but "upper-case"
# name the same resource.
SPELLINGS: dict[str, Callable[[str], str]] = {
    "plain": lambda p: p,
    "first-letter-escaped": lambda p: "/".join(
        f"%{ord(s[0]):02x}{s[1:]}" if s else s for s in p.split("/")
    ),
    "all-escaped": _escape_all,
    "all-escaped-lower-hex": lambda p: _escape_all(p).lower(),
    "double-slashes": lambda p: p.replace("/", "//"),
    "trailing-slash": lambda p: p + "/",
    "dot-segments": lambda p: "/./x/.." + p,
    "escaped-dot-segments": lambda p: "/%2e/x/%2E%2E" + p,
    "via-metrics": lambda p: "/metrics/.." + p,
    "via-healthz-escaped": lambda p: "/healthz/%2e%2e" + p,
    "absolute-form": lambda p: "http://127.0.0.1:8161" + p,
    "absolute-form-upper": lambda p: "HTTP://LOCALHOST" + p,
    "query": lambda p: p + "?limit=100",
    "upper-case": lambda p: p.upper(),  # another path: 404 once authenticated
}


def nested_list(depth: int) -> bytes:
    """[[[...]]] `depth` deep: list32 frames around the encoder's empty list (the encoder
    itself recurses, so it cannot build 10,000 levels)."""
    value = sections.encode_value([])
    for _ in range(depth):
        value = b"\xd0" + struct.pack(">II", len(value) + 4, 1) + value
    return value
