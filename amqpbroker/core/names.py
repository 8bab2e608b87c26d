"""Address and queue names: FQQN, routing-type prefixes, parameters, validation.

B-006 (FQQN `address::queue`), B-007 (anycast/multicast prefixes), B-036 (source-address
query parameters) and B-150 (which names are refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from amqpbroker.core.errors import ClientError
from amqpbroker.core.model import RoutingType

FQQN_SEPARATOR = "::"
_ADVISORY_CHARS = ("&", ",", ">", " ")


@dataclass(frozen=True, slots=True)
class ParsedName:
    """A link address split into its parts."""

    address: str
    queue: str | None = None  # the queue part of an FQQN
    routing_type: RoutingType | None = None  # forced by a prefix (B-007)
    parameters: tuple[tuple[str, str], ...] = ()  # after '?' in a source address (B-036)


def validate_name(name: str, *, what: str = "address") -> None:
    """Refuse empty names, control characters and lone surrogates (B-150)."""
    if not name:
        raise ClientError(f"{what} name must not be empty")
    if any(ord(ch) < 0x20 for ch in name):
        raise ClientError(f"{what} name {name!r} contains a control character")
    if not is_text(name):
        raise ClientError(f"{what} name {name!r} is not Unicode text (a lone surrogate)")


def is_text(name: str) -> bool:
    """Whether `name` has no lone surrogate, which JSON and YAML escapes can spell and no
    UTF-8 encoder takes: the journal's records, page file names and /metrics labels
    (issue 15 attack)."""
    return not any(0xD800 <= ord(ch) <= 0xDFFF for ch in name)


def advisory_characters(name: str) -> list[str]:
    """Characters seed 001 advises against; accepted, but worth one warning (B-150)."""
    return [ch for ch in _ADVISORY_CHARS if ch in name]


def parse_address(
    raw: str,
    *,
    anycast_prefix: str | None = None,
    multicast_prefix: str | None = None,
    allow_parameters: bool = False,
) -> ParsedName:
    """Split `raw` into prefix routing type, address, FQQN queue and parameters.

    Raises:
        ClientError: the name is empty, has control characters or more than one `::`.
    """
    parameters: tuple[tuple[str, str], ...] = ()
    if allow_parameters and "?" in raw:
        raw, query = raw.split("?", 1)
        pairs = []
        for item in query.split("&"):
            if item:
                key, _, value = item.partition("=")
                pairs.append((key, value))
        parameters = tuple(pairs)
    routing_type = None
    if anycast_prefix and raw.startswith(anycast_prefix):
        raw, routing_type = raw[len(anycast_prefix) :], RoutingType.ANYCAST
    elif multicast_prefix and raw.startswith(multicast_prefix):
        raw, routing_type = raw[len(multicast_prefix) :], RoutingType.MULTICAST
    if raw.count(FQQN_SEPARATOR) > 1:
        raise ClientError(f"address {raw!r} has more than one '{FQQN_SEPARATOR}'")
    queue = None
    if FQQN_SEPARATOR in raw:
        raw, queue = raw.split(FQQN_SEPARATOR, 1)
        validate_name(queue, what="queue")
    validate_name(raw)
    return ParsedName(raw, queue, routing_type, parameters)
