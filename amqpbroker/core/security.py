"""Authorization: `security-settings` by address pattern (B-154, Artemis security-settings).

Patterns use the same wildcard engine and specificity order as address-settings (B-100).
As in Artemis, the most specific matching entry decides on its own (its role lists are not
merged with broader entries): a permission that entry does not grant to any of the
user's roles is refused. No matching entry means no permission.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from amqpbroker.core.errors import NotAuthorized
from amqpbroker.core.management import MANAGEMENT_ADDRESS
from amqpbroker.core.wildcard import WildcardConfig

PERMISSIONS = frozenset(
    {
        "send",
        "consume",
        "browse",
        "create-address",
        "delete-address",
        "create-durable-queue",
        "delete-durable-queue",
        "create-non-durable-queue",
        "delete-non-durable-queue",
        "manage",
    }
)


class SecurityRepository:
    """Who may do what where. Roles None means security is disabled: everything allowed."""

    def __init__(
        self,
        settings: Mapping[str, Mapping[str, tuple[str, ...]]],
        *,
        wildcards: WildcardConfig | None = None,
    ) -> None:
        self.wildcards = wildcards or WildcardConfig()
        self._settings = {pattern: dict(perms) for pattern, perms in settings.items()}
        self._cache: dict[str, dict[str, tuple[str, ...]]] = {}
        self._pattern_cache: dict[str, list[dict[str, tuple[str, ...]]]] = {}

    def entry(self, address: str) -> dict[str, tuple[str, ...]]:
        """The permissions of the most specific pattern matching `address`."""
        address = address.split("::", 1)[0]
        cached = self._cache.get(address)
        if cached is None:
            wc = self.wildcards
            hits = [p for p in self._settings if p == address or wc.matches(p, address)]
            hits.sort(key=lambda p: (0,) if p == address else wc.specificity_key(p))
            cached = self._settings[hits[0]] if hits else {}
            self._cache[address] = cached
        return cached

    def allowed(self, roles: frozenset[str] | None, permission: str, address: str) -> bool:
        if roles is None:
            return True
        address = address.split("::", 1)[0]
        if self.wildcards.has_wildcard(address):
            entries = self._pattern_entries(address)
            return bool(entries) and all(
                any(role in roles for role in entry.get(permission, ())) for entry in entries
            )
        return any(role in roles for role in self.entry(address).get(permission, ()))

    def _pattern_entries(self, pattern: str) -> list[dict[str, tuple[str, ...]]]:
        """The entries that decide for some address a wildcard `pattern` (a wildcard
        subscription) can name: a permission on the pattern is one on each of them.

        Issue 15 attack: `pattern` was looked up as one address, so `a.#` took the entry of
        `a.*` (whose `*` matches the word `#`), and a user allowed to consume `a.*` received
        `a.x.secret`, which only `#` grants. Now: the most specific entry covering every
        address of `pattern`, and each more specific entry that covers some of them (for
        those it is the one that decides). None covering all: no permission. A literal
        pattern naming the management address decides for no message (B-160: requests
        there are never routed), so it is left out.
        """
        cached = self._pattern_cache.get(pattern)
        if cached is not None:
            return cached
        wc = self.wildcards
        words = tuple(pattern.split(wc.delimiter))

        def split(p: str) -> tuple[str, ...]:
            return tuple(p.split(wc.delimiter))

        covering = [p for p in self._settings if _covers(split(p), words, wc)]
        entries: list[dict[str, tuple[str, ...]]] = []
        if covering:
            best = min(wc.specificity_key(p) for p in covering)
            entries = [
                self._settings[p]
                for p in self._settings
                if p != MANAGEMENT_ADDRESS
                and wc.specificity_key(p) <= best
                and _overlap(split(p), words, wc)
            ]
        self._pattern_cache[pattern] = entries
        return entries

    def require(
        self,
        roles: frozenset[str] | None,
        permission: str,
        address: str,
        *,
        user: str | None = None,
    ) -> None:
        """Raise NotAuthorized naming the permission (never other addresses)."""
        if not self.allowed(roles, permission, address):
            who = f"user {user}" if user else "this user"
            raise NotAuthorized(
                f"{who} does not have permission '{permission}' on address {address}"
            )


def _covers(pattern: tuple[str, ...], words: tuple[str, ...], wc: WildcardConfig) -> bool:
    """Whether every address the pattern `words` names is matched by `pattern`."""
    if not pattern:
        return not words
    head = pattern[0]
    if head == wc.any_words:
        return True
    if not words or words[0] == wc.any_words:
        return False
    if head == wc.single_word or (head == words[0] and words[0] != wc.single_word):
        return _covers(pattern[1:], words[1:], wc)
    return False


def _overlap(pattern: tuple[str, ...], words: tuple[str, ...], wc: WildcardConfig) -> bool:
    """Whether some address is matched both by `pattern` and by the pattern `words`."""
    if (pattern and pattern[0] == wc.any_words) or (words and words[0] == wc.any_words):
        return True
    if not pattern or not words:
        return not pattern and not words
    one = wc.single_word
    if pattern[0] == one or words[0] == one or pattern[0] == words[0]:
        return _overlap(pattern[1:], words[1:], wc)
    return False


def source_key(host: str) -> str:
    """Who is throttled as one (failed logins: SASL in `security/logins.py`, HTTP in
    `management/auth.py`): an IPv4 address, or an IPv6 /64 (one subscriber's allocation,
    which holds 2**64 addresses)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


# The wider networks a source is also throttled as, with how many sources' failures each
# may have: one subscriber or site holds a /56 or /48 of /64s (256 or 65,536), so keyed
# by the /64 alone a client rotating through its /56 made 2,560 HTTP guesses a minute
# (10 each), and through 4,096 /64s pushed its throttled ones out of the bounded tables
# (issue 15 attack). A /48 may fail as 16 sources do.
SITE_PREFIX = 48
SITE_SOURCES = 16


def source_keys(host: str) -> tuple[tuple[str, int], ...]:
    """The keys a failed login from `host` counts against, each with how many sources'
    failures it may have before it is throttled: the source (`source_key`), and for an
    IPv6 address (not IPv4-mapped) its /48 too."""
    key = source_key(host)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return ((key, 1),)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        site = str(ipaddress.IPv6Network((address, SITE_PREFIX), strict=False))
        return ((key, 1), (site, SITE_SOURCES))
    return ((key, 1),)
