"""AMQP terminus -> core attach requests, and the attach answers back (B-020…B-038).

Only translation lives here: which queue a link gets is decided by `core.Broker`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cproton_ffi import lib
from proton import Data, Described, Link, Terminus, symbol

from amqpbroker.core import ConnectionId, ConsumerRequest, ProducerRequest, Window
from amqpbroker.protocol.peer import (
    PeerInvalidField,
    data_at,
    read_filter_set,
    read_link_name,
    read_symbol_map,
    read_symbols,
    read_text,
)

SELECTOR_FILTER = symbol("apache.org:selector-filter:string")
SELECTOR_DESCRIPTOR_CODE = 0x0000468C00000004
NO_LOCAL_FILTER = symbol("apache.org:no-local-filter:list")
NO_LOCAL_DESCRIPTOR_CODE = 0x0000468C00000003

_EXPIRY_POLICIES = {
    Terminus.EXPIRE_WITH_LINK: "link-detach",
    Terminus.EXPIRE_WITH_SESSION: "session-end",
    Terminus.EXPIRE_WITH_CONNECTION: "connection-close",
    Terminus.EXPIRE_NEVER: "never",
}


@dataclass(frozen=True, slots=True)
class TerminusFields:
    """A remote source or target, every field read and checked (protocol/peer.py).

    The broker answers an attach with a terminus built from these values, never with a
    copy of the peer's (issue 15: a copied malformed field crashes the engine).
    """

    type: int
    address: str | None
    durability: int
    expiry_policy: int
    timeout: int
    dynamic: bool
    distribution_mode: int
    capabilities: tuple[str, ...]
    outcomes: tuple[str, ...]
    filters: dict[Any, Any]


def read_terminus(remote: Terminus, field: str) -> TerminusFields:
    """Read `remote` (the attach's `source` or `target`, named by `field`) safely.

    Raises:
        PeerDecodeError, PeerInvalidField: a malformed or wrongly typed field.
    """
    kind = remote.type
    return TerminusFields(
        type=kind,
        address=read_text(lambda: remote.address, f"{field}.address"),
        durability=remote.durability,
        expiry_policy=remote.expiry_policy,
        timeout=remote.timeout,
        dynamic=bool(remote.dynamic),
        distribution_mode=remote.distribution_mode,
        capabilities=read_symbols(remote.capabilities, f"{field}.capabilities"),
        outcomes=read_symbols(remote.outcomes, f"{field}.outcomes")
        if kind == Terminus.SOURCE
        else (),
        filters=read_filter_set(remote.filter, f"{field}.filter")
        if kind == Terminus.SOURCE
        else {},
    )


def answer_terminus(local: Terminus, fields: TerminusFields, *, address: str | None) -> None:
    """The broker's terminus: the checked fields echoed, with the broker's `address`.

    Filters are not echoed here: `echo_source_filter` answers only those honoured.
    """
    if fields.type == Terminus.UNSPECIFIED:
        return  # a null source or target stays null
    local.type = fields.type
    if address is not None:
        local.address = address
    local.durability = fields.durability
    local.expiry_policy = fields.expiry_policy
    local.timeout = fields.timeout
    local.dynamic = fields.dynamic
    if fields.type == Terminus.SOURCE:
        local.distribution_mode = fields.distribution_mode
    _put_symbols(local.capabilities, fields.capabilities)
    _put_symbols(local.outcomes, fields.outcomes)


def _put_symbols(data: Data, values: tuple[str, ...]) -> None:
    data.clear()
    if values:
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for value in values:
            data.put_symbol(symbol(value))
        data.exit()


def _is_filter(value: Any, name: symbol, code: int) -> bool:
    return isinstance(value, Described) and value.descriptor in (name, code)


def selector_of(filters: dict[Any, Any]) -> tuple[Any, Any] | None:
    """The (key, described value) of the JMS selector filter, if any (B-032)."""
    for key, value in filters.items():
        if _is_filter(value, SELECTOR_FILTER, SELECTOR_DESCRIPTOR_CODE):
            return key, value
    return None


def has_no_local(filters: dict[Any, Any]) -> bool:
    return any(_is_filter(v, NO_LOCAL_FILTER, NO_LOCAL_DESCRIPTOR_CODE) for v in filters.values())


def producer_request(
    target: TerminusFields,
    connection: ConnectionId,
    *,
    anycast_prefix: str | None,
    multicast_prefix: str | None,
    user: str | None = None,
    roles: frozenset[str] | None = None,
) -> ProducerRequest:
    return ProducerRequest(
        connection=connection,
        address=target.address,
        capabilities=target.capabilities,
        dynamic=target.dynamic,
        anycast_prefix=anycast_prefix,
        multicast_prefix=multicast_prefix,
        user=user,
        roles=roles,
    )


def consumer_request(
    link: Link,
    source: TerminusFields,
    connection: ConnectionId,
    container_id: str,
    *,
    anycast_prefix: str | None,
    multicast_prefix: str | None,
    user: str | None = None,
    roles: frozenset[str] | None = None,
    window: Window | None = None,
) -> ConsumerRequest:
    filters = source.filters
    selector = selector_of(filters)
    return ConsumerRequest(
        connection=connection,
        container_id=container_id,
        link_name=read_link_name(link),
        address=source.address,
        capabilities=source.capabilities,
        dynamic=source.dynamic,
        durable=source.durability in (Terminus.CONFIGURATION, Terminus.DELIVERIES),
        expiry_policy=_EXPIRY_POLICIES.get(source.expiry_policy, "session-end"),
        browse=source.distribution_mode == Terminus.DIST_MODE_COPY,
        selector=_selector_text(selector[1]) if selector else None,
        no_local=has_no_local(filters),
        presettled=link.remote_snd_settle_mode == Link.SND_SETTLED,
        priority=_priority(link),
        null_source=source.type == Terminus.UNSPECIFIED,
        user=user,
        roles=roles,
        anycast_prefix=anycast_prefix,
        multicast_prefix=multicast_prefix,
        max_message_size=link.remote_max_message_size or 0,  # AMQP 2.7.3
        window=window,
    )


def _selector_text(filter_value: Any) -> str:
    value = filter_value.value
    if not isinstance(value, str):
        raise PeerInvalidField("source.filter", "the selector filter's value is not a string")
    return str(value)


def _priority(link: Link) -> int | None:
    """B-035: the attach `properties` key `priority` (int, byte or uint accepted)."""
    properties = read_symbol_map(
        data_at(lib.pn_link_remote_properties(link._impl)), "attach.properties"
    )
    value = properties.get("priority")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def echo_source_filter(
    link: Link, filters: dict[Any, Any], selector: str | None, *, no_local: bool = False
) -> None:
    """Answer only the filters the broker honours (B-032, B-034): the selector, if used,
    and no-local on subscriptions. `filters` are the checked ones (`read_terminus`)."""
    answer = {}
    found = selector_of(filters)
    if selector is not None and found is not None:
        answer[found[0]] = found[1]
    if no_local:
        for key, value in filters.items():
            if _is_filter(value, NO_LOCAL_FILTER, NO_LOCAL_DESCRIPTOR_CODE):
                answer[key] = value
    link.source.filter.clear()
    if answer:
        link.source.filter.put_object(answer)


def recovered_source(link: Link, selector: str | None) -> None:
    """B-029: the source of a recovered subscription: durable unsettled-state, expiry
    never, distribution-mode copy, capability topic, and its stored selector."""
    source = link.source
    source.type = Terminus.SOURCE
    source.durability = Terminus.DELIVERIES
    source.expiry_policy = Terminus.EXPIRE_NEVER
    source.distribution_mode = Terminus.DIST_MODE_COPY
    source.capabilities.clear()
    source.capabilities.put_array(False, Data.SYMBOL)
    source.capabilities.enter()
    source.capabilities.put_symbol(symbol("topic"))
    source.capabilities.exit()
    source.filter.clear()
    if selector:
        source.filter.put_object({SELECTOR_FILTER: Described(SELECTOR_FILTER, selector)})
