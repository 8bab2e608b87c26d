"""AMQP terminus -> core attach requests, and the attach answers back (B-020…B-038).

Only translation lives here: which queue a link gets is decided by `core.Broker`.
"""

from __future__ import annotations

from typing import Any

from proton import Data, Described, Link, Terminus, symbol

from amqpbroker.core import ConnectionId, ConsumerRequest, ProducerRequest

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


def symbols(data: Data | None) -> tuple[str, ...]:
    """The symbols of a capabilities field (a single symbol or an array of them)."""
    if data is None:
        return ()
    data.rewind()
    if not data.next():
        return ()
    value = data.get_object()
    if isinstance(value, str):
        return (str(value),)
    try:
        return tuple(str(v) for v in value)
    except TypeError:
        return ()


def filter_map(data: Data | None) -> dict[Any, Any]:
    if data is None:
        return {}
    data.rewind()
    if not data.next():
        return {}
    value = data.get_object()
    return dict(value) if isinstance(value, dict) else {}


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
    link: Link,
    connection: ConnectionId,
    *,
    anycast_prefix: str | None,
    multicast_prefix: str | None,
    user: str | None = None,
    roles: frozenset[str] | None = None,
) -> ProducerRequest:
    target = link.remote_target
    return ProducerRequest(
        connection=connection,
        address=target.address,
        capabilities=symbols(target.capabilities),
        dynamic=bool(target.dynamic),
        anycast_prefix=anycast_prefix,
        multicast_prefix=multicast_prefix,
        user=user,
        roles=roles,
    )


def consumer_request(
    link: Link,
    connection: ConnectionId,
    container_id: str,
    *,
    anycast_prefix: str | None,
    multicast_prefix: str | None,
    user: str | None = None,
    roles: frozenset[str] | None = None,
) -> ConsumerRequest:
    source = link.remote_source
    filters = filter_map(source.filter)
    selector = selector_of(filters)
    return ConsumerRequest(
        connection=connection,
        container_id=container_id,
        link_name=link.name,
        address=source.address,
        capabilities=symbols(source.capabilities),
        dynamic=bool(source.dynamic),
        durable=source.durability in (Terminus.CONFIGURATION, Terminus.DELIVERIES),
        expiry_policy=_EXPIRY_POLICIES.get(source.expiry_policy, "session-end"),
        browse=source.distribution_mode == Terminus.DIST_MODE_COPY,
        selector=str(selector[1].value) if selector else None,
        no_local=has_no_local(filters),
        presettled=link.remote_snd_settle_mode == Link.SND_SETTLED,
        priority=_priority(link),
        null_source=source.type == Terminus.UNSPECIFIED,
        user=user,
        roles=roles,
        anycast_prefix=anycast_prefix,
        multicast_prefix=multicast_prefix,
        max_message_size=link.remote_max_message_size or 0,  # AMQP 2.7.3
    )


def _priority(link: Link) -> int | None:
    """B-035: the attach `properties` key `priority` (int, byte or uint accepted)."""
    properties = link.remote_properties
    if not properties:
        return None
    value = properties.get(symbol("priority"), properties.get("priority"))
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def echo_source_filter(link: Link, selector: str | None, *, no_local: bool = False) -> None:
    """Answer only the filters the broker honours (B-032, B-034): the selector, if used,
    and no-local on subscriptions."""
    filters = filter_map(link.remote_source.filter)
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
