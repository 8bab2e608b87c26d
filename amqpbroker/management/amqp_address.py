"""The AMQP management address `activemq.management`: request and reply (B-160…B-162).

Theory of operation
-------------------
An Artemis tool sends a message to `activemq.management` with `reply-to` set and the
application-properties `_AMQ_ResourceName` (`broker`, `queue.<name>`, `address.<name>`)
and either `_AMQ_OperationName`, with an amqp-value body holding a JSON array of the
arguments (the overload is chosen by their count), or `_AMQ_Attribute` (camelCase, no
`get`). The core has already checked the sender's `manage` permission (B-154,
`core/management.py`) when it hands the message to `AmqpManagement.handle`.

The reply goes to `reply-to` through the broker like any message (to a temporary queue or
a named address, auto-created as a sender's would be, acting for the broker). It carries
`correlation-id` = the request's correlation-id, else its message-id, the boolean
`_AMQ_OperationSucceeded`, and an amqp-value string holding a JSON array of one element:
the result, or the error text. Every request that is not understood (a missing or
non-string property, a body that is no JSON array, an argument of the wrong type or
count, an unknown resource, operation or attribute, a body over `MAX_REQUEST_BYTES`, one
nested too deep) gets a failure reply; a request without a usable `reply-to` is dropped
and logged, its operation not run (docs/decisions.md).

The operations are those of the HTTP API, in `core/operations.py` (one place each); the
validation of a created queue or of address-settings is the config loader's (one place:
the same messages and refusals as a config file, `core/unsupported.py` included).

Loop thread only.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from amqpbroker import __version__
from amqpbroker.amqp import sections
from amqpbroker.amqp.sections import Described, ULong
from amqpbroker.config import BrokerConfig, ConfigError, parse_config
from amqpbroker.core import (
    Broker,
    BrokerError,
    ClientError,
    Message,
    NotFound,
    RoutingType,
    WildcardConfig,
)
from amqpbroker.core import operations as ops
from amqpbroker.core.management import MANAGEMENT_ADDRESS
from amqpbroker.core.model import ProducerTarget
from amqpbroker.core.names import parse_address
from amqpbroker.core.queue import Queue
from amqpbroker.core.reaper import CREATED_AUTO_DELETE
from amqpbroker.core.refs import Ref
from amqpbroker.management.api import json_safe

log = logging.getLogger(__name__)

RESOURCE = "_AMQ_ResourceName"
OPERATION = "_AMQ_OperationName"
ATTRIBUTE = "_AMQ_Attribute"
SUCCEEDED = "_AMQ_OperationSucceeded"
MAX_REQUEST_BYTES = 1024 * 1024  # a request's JSON text; more is refused, not parsed
# What one request hands the config loader (PyYAML in pure Python, on the event loop): a
# queue configuration or an address-settings entry is a flat object of a few dozen
# scalars. Within MAX_REQUEST_BYTES, 50,000 unknown keys took it 9 s (a "did you mean"
# each) and nested lists ~30 s, every connection stalled (issue 15 attack); with these
# bounds a request costs it ~50 ms at most.
MAX_CONFIG_KEYS = 100
MAX_CONFIG_BYTES = 64 * 1024
_PROPERTIES, _APPLICATION_PROPERTIES, _AMQP_VALUE, _DATA = 0x73, 0x74, 0x77, 0x75
_MAX_ID = 2**63 - 1


class RequestError(ClientError):
    """A request the management address does not understand (its text is the reply)."""


Args = list[Any]


# -- arguments ------------------------------------------------------------------------


def _filter(value: Any) -> str | None:
    """A B-130 filter, or null/empty for all messages."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RequestError(f"a filter must be a string or null, not {_kind(value)}")
    return value


def _message_id(value: Any) -> int:
    """A broker message id (as in x-opt-ORIG-MESSAGE-ID): a number, or digits as text."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise RequestError(f"a message id must be a non-negative integer, not {_kind(value)}")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(f"{what} must be a non-empty string, not {_kind(value)}")
    return value


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{what} must be true or false, not {_kind(value)}")
    return value


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > _MAX_ID:
        raise RequestError(f"{what} must be an integer, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    text = json.dumps(value)[:40] if _jsonable(value) else type(value).__name__
    return f"{type(value).__name__} {text}"


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _routing_types(value: Any) -> set[RoutingType]:
    """`ANYCAST`, `MULTICAST` or both comma-separated (Artemis), or a JSON list of them."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise RequestError(f"routingTypes must be ANYCAST and/or MULTICAST, not {_kind(value)}")
    out = set()
    for item in items:
        name = item.strip().upper() if isinstance(item, str) else None
        if name not in ("ANYCAST", "MULTICAST"):
            raise RequestError(f"unknown routing type {_kind(item)}")
        out.add(RoutingType(name))
    return out


def _loads(text: str, what: str) -> Any:
    """`text` as JSON, refused when a string in it is not Unicode text.

    JSON escapes can spell lone surrogates (`"\\udc80"`), which no UTF-8 encoder takes: an
    address created with one failed the journal's encoding (every durable send refused
    until a restart) and every /metrics scrape (issue 15 attack).

    Raises:
        RequestError: not JSON, or a lone surrogate in a string.
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"{what} is not valid JSON: {str(e)[:200]}") from None
    try:  # ensure_ascii=False keeps the surrogates for the strict encoder to find
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{what} holds a string that is not Unicode text") from None
    except (ValueError, RecursionError) as e:  # never expected: it was just parsed
        raise RequestError(f"{what} is not valid JSON: {str(e)[:200]}") from None
    return value


def _json_object(value: Any, what: str) -> dict[str, Any]:
    """A JSON object given as its text (Artemis passes JSON arguments as strings)."""
    if isinstance(value, str):
        value = _loads(value.strip() or "{}", what)
    if not isinstance(value, dict):
        raise RequestError(f"{what} must be a JSON object, not {_kind(value)}")
    return value


def _kebab(key: str) -> str:
    """deadLetterAddress -> dead-letter-address (Artemis JSON keys); kebab stays as is."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", key).lower()


def _loader_problems(e: ConfigError) -> str:
    """The config loader's messages without the meaningless file and line."""
    return "; ".join(f"{p.path}: {p.message}" for p in e.problems)


def _flat_object(value: Any, what: str) -> dict[str, Any]:
    """A queue configuration or an address-settings entry: a JSON object of at most
    MAX_CONFIG_KEYS scalars (every key the loader takes there is one)."""
    config = _json_object(value, what)
    if len(config) > MAX_CONFIG_KEYS:
        raise RequestError(f"{what} has more than {MAX_CONFIG_KEYS} keys")
    for key, item in config.items():
        if not _jsonable(item):
            raise RequestError(
                f"{what}: {key[:100]!r} must be a string, number, boolean or null, "
                f"not {type(item).__name__}"
            )
    return config


def _load(document: dict[str, Any]) -> BrokerConfig:
    """`document` checked by the config loader (one place: its messages and refusals).

    Raises:
        RequestError: its problems, or a document over MAX_CONFIG_BYTES.
    """
    text = json.dumps(document)
    if len(text) > MAX_CONFIG_BYTES:
        raise RequestError(f"the configuration is over {MAX_CONFIG_BYTES} bytes")
    try:
        return parse_config(text)
    except ConfigError as e:
        raise RequestError(_loader_problems(e)) from None


# -- queue operations (B-161) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Walking:
    """An answer to walk a slice at a time (issue 23, B-151 with B-160): a filtered
    operation over a paged queue reads every page file (~20 us a message), and run at
    once it held the loop ~20 s at 1M. `AmqpManagement.handle` runs its first slice at
    once (a small queue is answered in the request's loop turn, as before) and the rest
    a slice per loop turn (`Broker.run_in_background`), then replies. `finish` makes the
    reply's value of the walk's result."""

    walk: ops.Walk[Any]
    finish: Callable[[Any], Any] = lambda result: result


def _retried(broker: Broker, queue: str, args: Args) -> Walking:
    walk = ops.retry_walk(broker, queue, selector=_filter(args[0]) if args else None)
    return Walking(walk, lambda result: result.retried)


def _list_messages(broker: Broker, queue: str, args: Args) -> Walking:
    """At most `management-browse-page-size` messages (B-160)."""
    address = broker.queues[queue].address
    limit = broker.settings.resolve(address).management_browse_page_size
    selector = _filter(args[0]) if args else None
    walk = ops.browse_walk(broker, queue, selector=selector, limit=limit)
    return Walking(walk, lambda refs: [message_map(ref) for ref in refs])


def _move(broker: Broker, queue: str, args: Args, *, one: bool) -> bool | Walking:
    reject = _flag(args[2], "rejectDuplicates") if len(args) == 3 else False
    target = _name(args[1], "otherQueueName")
    if one:
        ids = [_message_id(args[0])]
        return ops.move(broker, queue, to_queue=target, ids=ids, reject_duplicates=reject) == 1
    selector = _filter(args[0])
    return Walking(
        ops.move_walk(broker, queue, to_queue=target, selector=selector, reject_duplicates=reject)
    )


def _count(broker: Broker, queue: str, args: Args) -> int | Walking:
    selector = _filter(args[0]) if args else None
    if not selector:  # O(1), answered even while a walk holds the queue
        return ops.count(broker, queue)
    return Walking(ops.count_walk(broker, queue, selector=selector))


QueueOperation = Callable[[Broker, str, Args], Any]
# name -> number of arguments -> what it does (Artemis QueueControl, B-161)
QUEUE_OPERATIONS: dict[str, dict[int, QueueOperation]] = {
    "retryMessages": {0: _retried, 1: _retried},
    "retryMessage": {
        1: lambda b, q, a: ops.retry(b, q, ids=[_message_id(a[0])]).retried == 1,
    },
    "moveMessages": {
        2: lambda b, q, a: _move(b, q, a, one=False),
        3: lambda b, q, a: _move(b, q, a, one=False),
    },
    "moveMessage": {
        2: lambda b, q, a: _move(b, q, a, one=True),
        3: lambda b, q, a: _move(b, q, a, one=True),
    },
    "sendMessagesToDeadLetterAddress": {
        1: lambda b, q, a: Walking(ops.dead_letter_walk(b, q, selector=_filter(a[0]))),
    },
    "sendMessageToDeadLetterAddress": {
        1: lambda b, q, a: ops.dead_letter(b, q, ids=[_message_id(a[0])]) == 1,
    },
    "expireMessages": {1: lambda b, q, a: Walking(ops.expire_walk(b, q, selector=_filter(a[0])))},
    "expireMessage": {1: lambda b, q, a: ops.expire(b, q, ids=[_message_id(a[0])]) == 1},
    "removeMessages": {1: lambda b, q, a: Walking(ops.purge_walk(b, q, selector=_filter(a[0])))},
    "removeAllMessages": {0: lambda b, q, a: Walking(ops.purge_walk(b, q))},
    "removeMessage": {1: lambda b, q, a: ops.purge(b, q, ids=[_message_id(a[0])]) == 1},
    "listMessages": {1: _list_messages},
    "countMessages": {0: _count, 1: _count},
    "countDeliveringMessages": {
        1: lambda b, q, a: ops.count_delivering(b, q, selector=_filter(a[0])),
    },
    "changeMessagesPriority": {
        2: lambda b, q, a: ops.change_priority(
            b, q, selector=_filter(a[0]), priority=_int(a[1], "newPriority")
        ),
    },
    "changeMessagePriority": {
        2: lambda b, q, a: (
            ops.change_priority(b, q, ids=[_message_id(a[0])], priority=_int(a[1], "newPriority"))
            == 1
        ),
    },
    "pause": {0: lambda b, q, a: ops.pause(b, q, paused=True)},
    "resume": {0: lambda b, q, a: ops.pause(b, q, paused=False)},
}


def message_map(ref: Ref) -> dict[str, Any]:
    """One listMessages entry (B-161): the Artemis keys, then the application properties
    (which never replace those keys)."""
    m = ref.message
    properties = m.get_properties()
    message_id = properties.get("message-id")
    created = properties.get("creation-time")
    out: dict[str, Any] = {
        "messageID": m.msg_id,
        "userID": None if message_id is None else f"ID:{json_safe(message_id)}",
        "address": m.address,
        "durable": m.durable,
        "priority": m.priority,
        "timestamp": created if isinstance(created, int) else m.first_ts,
        "expiration": m.expiration_ms,
        "deliveryCount": ref.delivery_count,
    }
    for key, value in m.get_application_properties().items():
        out.setdefault(str(key), json_safe(value))
    return out


def queue_attributes(broker: Broker, queue: Queue) -> dict[str, Any]:
    """The read-only attributes of B-161, by their Artemis names."""
    settings = broker.settings.resolve(queue.address)
    config = queue.config
    counters = queue.counters
    if config.auto_created:
        auto_delete = settings.auto_delete_queues
    else:
        auto_delete = config.extra.get(CREATED_AUTO_DELETE) is True
    return {
        "name": queue.name,
        "address": queue.address,
        "messageCount": queue.message_count,
        "deliveringCount": queue.delivering,
        "scheduledCount": queue.scheduled_count,
        "consumerCount": len(queue.consumers),
        "messagesAdded": counters.added,
        "messagesAcknowledged": counters.acknowledged,
        "messagesExpired": counters.expired,
        "messagesKilled": counters.killed,
        "deadLetterAddress": settings.dead_letter_address or None,
        "expiryAddress": settings.expiry_address or None,
        "maxConsumers": config.max_consumers,
        "routingType": queue.routing_type.value,
        "filter": config.filter,
        "durable": queue.durable,
        "temporary": config.temporary or queue.owner is not None,
        "autoCreated": config.auto_created,
        "autoDelete": bool(auto_delete) and not config.configured,
        "exclusive": config.exclusive,
        "purgeOnNoConsumers": config.purge_on_no_consumers,  # B-126
        "groupRebalance": config.group_rebalance,  # B-127
        "groupRebalancePauseDispatch": config.group_rebalance_pause_dispatch,
        "groupBuckets": config.group_buckets,
        "groupFirstKey": config.group_first_key,
        "groupCount": 0 if queue.policy is None else len(queue.policy.groups),
        "consumersBeforeDispatch": config.consumers_before_dispatch,  # B-128
        "delayBeforeDispatch": config.delay_before_dispatch,
        "lastValue": config.last_value_key is not None,
        "lastValueKey": config.last_value_key,  # B-120
        "nonDestructive": config.non_destructive,  # B-123
        "ringSize": config.ring_size,
        "paused": queue.paused,
    }


# -- broker operations (B-162) --------------------------------------------------------


def _queue_names(broker: Broker, args: Args) -> list[str]:
    wanted = None
    if args:
        wanted = _name(args[0], "routingType").upper()
        if wanted not in ("ANYCAST", "MULTICAST"):
            raise RequestError(f"unknown routing type {_kind(args[0])}")
    return sorted(
        q.name for q in broker.queues.values() if wanted is None or q.routing_type.value == wanted
    )


def _create_address(broker: Broker, args: Args) -> None:
    name = _name(args[0], "name")
    types = _routing_types(args[1])
    if name in broker.post_office.addresses:
        raise RequestError(f"address {name} already exists")
    _load({"addresses": [{"name": name}]})  # the loader's name rules (B-150)
    if name == MANAGEMENT_ADDRESS or broker.settings.wildcards.has_wildcard(name):
        raise RequestError(f"cannot create address {name}")
    broker.create_address(name, types)


# createQueue keys of Artemis QueueConfiguration that are not queue keys of the config
# file; every other key goes to the config loader as one (unknown ones refused there).
_CREATE_ONLY = ("name", "address", "routing-type", "auto-create-address", "auto-delete")


def _create_queue(broker: Broker, args: Args) -> str:
    """B-162 createQueue(queueConfigurationJSON[, ignoreIfExists]): checked by the config
    loader as a configured queue would be; answers the created queue's JSON."""
    spec = {_kebab(k): v for k, v in _flat_object(args[0], "queueConfiguration").items()}
    ignore = _flag(args[1], "ignoreIfExists") if len(args) > 1 else False
    name = _name(spec.get("name"), "name")
    address = _name(spec.get("address", name), "address")
    routing = spec.get("routing-type", "MULTICAST")  # Artemis's default routing type
    if not isinstance(routing, str) or routing.upper() not in ("ANYCAST", "MULTICAST"):
        raise RequestError(f"routing-type must be ANYCAST or MULTICAST, not {_kind(routing)}")
    auto_create = _flag(spec.get("auto-create-address", False), "auto-create-address")
    auto_delete = spec.get("auto-delete")
    if auto_delete is not None:
        _flag(auto_delete, "auto-delete")
    if name in broker.queues:
        if ignore:
            return json.dumps(queue_attributes(broker, broker.queues[name]))
        raise RequestError(f"queue {name} already exists")
    queue_keys = {"filter" if k == "filter-string" else k: v for k, v in spec.items()}
    for key in _CREATE_ONLY:
        queue_keys.pop(key, None)
    document = {"addresses": [{"name": address, routing.lower(): [{"name": name, **queue_keys}]}]}
    config = _load(document)
    (queue_def,) = config.addresses[0].anycast or config.addresses[0].multicast
    queue = ops.create_queue(
        broker,
        queue_def.queue_config(
            address, RoutingType(routing.upper()), defaults=broker.settings_for(address)
        ),
        auto_create_address=auto_create,
        auto_delete=auto_delete,
    )
    return json.dumps(queue_attributes(broker, queue))


def _add_address_settings(broker: Broker, args: Args) -> None:
    """B-102/B-162: checked by the config loader as an address-settings entry; in effect
    until the broker stops (not written to the config file or the journal)."""
    match = _name(args[0], "match")
    values = {_kebab(k): v for k, v in _flat_object(args[1], "addressSettings").items()}
    config = _load({"address-settings": {match: values}})
    try:
        broker.settings.add(match, config.address_settings[match])
    except ValueError as e:  # the broker's own wildcard delimiters (B-101)
        raise RequestError(str(e)) from None
    broker.slow_settings_changed()  # core/slowconsumer.py: queues that now ask for checks


def _remove_address_settings(broker: Broker, args: Args) -> None:
    match = _name(args[0], "match")
    if match not in broker.settings.patterns:
        raise RequestError(f"no address-settings for {match}")
    broker.settings.remove(match)


_LIST_FIELDS = ("name", "address", "routingType", "messageCount", "consumerCount", "durable")
_OPERATIONS = ("EQUALS", "NOT_EQUALS", "CONTAINS", "NOT_CONTAINS", "GREATER_THAN", "LESS_THAN")


def _list_queues(broker: Broker, args: Args) -> str:
    """B-162 listQueues(optionsJSON, page, pageSize): Artemis's filter (field, operation,
    value) and sort (sortField/sortColumn, sortOrder), 1-based pages; answers
    `{"data": [...], "count": N}` as JSON text."""
    options = {_kebab(k): v for k, v in _json_object(args[0], "options").items()}
    page, size = _int(args[1], "page"), _int(args[2], "pageSize")
    if page < 1 or not 1 <= size <= 10_000:
        raise RequestError("page must be >= 1 and pageSize between 1 and 10000")
    rows = [queue_attributes(broker, q) for q in broker.queues.values()]
    field = options.get("field") or ""
    if field:
        if field not in _LIST_FIELDS:
            raise RequestError(f"cannot filter on {_kind(field)}: one of {', '.join(_LIST_FIELDS)}")
        operation = str(options.get("operation", "EQUALS")).upper()
        if operation not in _OPERATIONS:
            raise RequestError(f"unknown operation {_kind(operation)}")
        rows = [r for r in rows if _matches(r[field], operation, options.get("value"))]
    key = options.get("sort-field") or options.get("sort-column") or "name"
    if key not in _LIST_FIELDS:
        raise RequestError(f"cannot sort on {_kind(key)}")
    descending = str(options.get("sort-order", "asc")).lower() == "desc"
    rows.sort(key=lambda r: (str(type(r[key])), r[key]), reverse=descending)
    start = (page - 1) * size
    return json.dumps({"data": rows[start : start + size], "count": len(rows)})


def _matches(actual: Any, operation: str, wanted: Any) -> bool:
    text, target = str(actual), "" if wanted is None else str(wanted)
    if operation in ("GREATER_THAN", "LESS_THAN"):
        try:
            number = float(target)
        except ValueError:
            raise RequestError(f"{operation} needs a number, not {_kind(wanted)}") from None
        if not isinstance(actual, int | float) or isinstance(actual, bool):
            return False
        return actual > number if operation == "GREATER_THAN" else actual < number
    if operation == "CONTAINS":
        return target in text
    if operation == "NOT_CONTAINS":
        return target not in text
    equal = text.lower() == target.lower() if isinstance(actual, bool) else text == target
    return equal if operation == "EQUALS" else not equal


BrokerOperation = Callable[[Broker, Args], Any]
# name -> number of arguments -> what it does (Artemis ActiveMQServerControl, B-162)
BROKER_OPERATIONS: dict[str, dict[int, BrokerOperation]] = {
    "getQueueNames": {0: _queue_names, 1: _queue_names},
    "getAddressNames": {0: lambda b, a: sorted(b.post_office.addresses)},
    "createAddress": {2: _create_address},
    "deleteAddress": {
        1: lambda b, a: ops.delete_address(b, _name(a[0], "name")),
        2: lambda b, a: ops.delete_address(b, _name(a[0], "name"), force=_flag(a[1], "force")),
    },
    "createQueue": {1: _create_queue, 2: _create_queue},
    "destroyQueue": {
        1: lambda b, a: ops.destroy_queue(b, _name(a[0], "name")),
        2: lambda b, a: ops.destroy_queue(
            b, _name(a[0], "name"), remove_consumers=_flag(a[1], "removeConsumers")
        ),
    },
    "addAddressSettings": {2: _add_address_settings},
    "removeAddressSettings": {1: _remove_address_settings},
    "getAddressSettingsAsJSON": {
        1: lambda b, a: json.dumps(b.settings.resolve(_name(a[0], "address")).to_config()),
    },
    "listQueues": {3: _list_queues},
}

BROKER_ATTRIBUTES: dict[str, Callable[[Broker], Any]] = {
    "name": lambda b: b.name,
    "version": lambda b: __version__,
    "addressNames": lambda b: sorted(b.post_office.addresses),
    "queueNames": lambda b: sorted(b.queues),
}


def _address_attributes(broker: Broker, name: str) -> dict[str, Any]:
    address = broker.post_office.addresses.get(name)
    if address is None:
        raise NotFound(f"address {name} does not exist")
    return {
        "address": address.name,
        "routingTypes": sorted(t.value for t in address.routing_types),
        "queueNames": sorted(q.name for q in address.queues),
        "numberOfMessages": sum(q.message_count for q in address.queues),
        "autoCreated": address.auto_created,
        "temporary": address.temporary,
    }


# -- the request ----------------------------------------------------------------------


def _correlation(properties: dict[str, Any]) -> Any:
    """B-160: the request's correlation-id, else its message-id; only the AMQP message-id
    types (ulong, uuid, binary, string), anything else is left out."""
    for key in ("correlation-id", "message-id"):
        value = properties.get(key)
        if isinstance(value, str | bytes | uuid.UUID):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
            return value if isinstance(value, ULong) else ULong(value)
    return None


def _arguments(message: Message) -> Args:
    """The JSON array of the body (an amqp-value string, or a data section of UTF-8)."""
    data = message.data
    start = sections.scan(data).body_start
    if start >= len(data) or data[start] != 0:
        return []  # no body: no arguments
    descriptor, value_start = sections.decode_first(data, start + 1)
    if descriptor not in (_AMQP_VALUE, _DATA):
        raise RequestError("the body must be an amqp-value string holding a JSON array")
    if len(data) - value_start > MAX_REQUEST_BYTES + 8:
        raise RequestError(f"the request body is over {MAX_REQUEST_BYTES} bytes")
    body, _ = sections.decode_first(data, value_start)
    if body is None:
        return []
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("the body is not UTF-8 text") from None
    if not isinstance(body, str):
        raise RequestError("the body must be an amqp-value string holding a JSON array")
    if not body.strip():
        return []
    args = _loads(body, "the body")
    if not isinstance(args, list):
        raise RequestError("the body must be a JSON array of the operation's arguments")
    return args


def _string_property(values: dict[str, Any], key: str) -> str | None:
    value = values.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{key} must be a string, not {type(value).__name__}")
    return value


def _overload(table: dict[str, dict[int, Any]], name: str, args: Args, what: str) -> Any:
    overloads = table.get(name)
    if overloads is None:
        raise RequestError(f"unknown {what} operation {name!r}")
    run = overloads.get(len(args))
    if run is None:
        counts = " or ".join(str(n) for n in sorted(overloads))
        raise RequestError(f"{name} takes {counts} argument(s), not {len(args)}")
    return run


class AmqpManagement:
    """`core.ManagementHandler`: answers requests to the management address (B-160)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def handle(self, request: Message, sender: ProducerTarget | None = None) -> None:
        """Run the request and send the reply; drop it (logged) if it has no reply-to.

        The reply is published as the sender (B-154, third attack pass): `manage` does
        not grant `send`, and a reply to `reply-to` = any address let a manager put
        messages (their body partly theirs: the echoed resource name, the correlation-id)
        on addresses they may not send to, and auto-create addresses. A temporary
        address (a dynamic node, where management clients take their replies) needs no
        permission, as sending to one's own dynamic node needs none in Artemis.
        """
        try:
            properties = request.get_properties()
        except (sections.SectionError, RecursionError) as e:
            log.info("dropping management request %s: unreadable properties: %s", request, e)
            return
        reply_to = properties.get("reply-to")
        if not _usable_reply_to(reply_to, self.broker.settings.wildcards):
            log.info("dropping management request %s: no usable reply-to", request.msg_id)
            return
        try:
            result, succeeded = self._answer(request), True
        except (BrokerError, sections.SectionError, RecursionError) as e:
            result, succeeded = str(e) or type(e).__name__, False
        if isinstance(result, Walking):
            walking = result

            def step() -> bool:
                return self._step(walking, properties, reply_to, sender)

            if not step():
                self.broker.run_in_background(step)
            return
        self._send_reply(properties, reply_to, sender, result, succeeded)

    def _step(
        self,
        walking: Walking,
        properties: dict[str, Any],
        reply_to: str,
        sender: ProducerTarget | None,
    ) -> bool:
        """A slice of a walking answer; once it is done, the reply (True)."""
        walking.walk.timer = time.monotonic  # a slice also ends after ops.SLICE_S
        try:
            if not walking.walk.step():
                return False
            result, succeeded = walking.finish(walking.walk.result), True
        except (BrokerError, sections.SectionError, RecursionError) as e:
            result, succeeded = str(e) or type(e).__name__, False
        self._send_reply(properties, reply_to, sender, result, succeeded)
        return True

    def _send_reply(
        self,
        properties: dict[str, Any],
        reply_to: str,
        sender: ProducerTarget | None,
        result: Any,
        succeeded: bool,
    ) -> None:
        try:
            text = json.dumps([json_safe(result)])
        except (ValueError, RecursionError) as e:  # never expected: json_safe bounds it
            text, succeeded = json.dumps([f"the result cannot be written: {e}"]), False
        reply = _reply(_correlation(properties), reply_to, succeeded, text)
        as_sender = ProducerTarget(None)
        if sender is not None and sender.roles is not None:
            found = self.broker.post_office.addresses.get(parse_address(reply_to).address)
            if found is None or not found.temporary:
                as_sender = ProducerTarget(None, user=sender.user, roles=sender.roles)
        try:
            self.broker.publish(reply, as_sender, to=reply_to)
        except BrokerError as e:
            log.info("management reply to %s not delivered: %s", reply_to, e)

    def _answer(self, request: Message) -> Any:
        values = request.get_application_properties()
        resource = _string_property(values, RESOURCE)
        operation = _string_property(values, OPERATION)
        attribute = _string_property(values, ATTRIBUTE)
        if not resource:
            raise RequestError(f"{RESOURCE} is missing")
        if (operation is None) == (attribute is None):
            raise RequestError(f"a request has either {OPERATION} or {ATTRIBUTE}")
        broker = self.broker
        kind, _, name = resource.partition(".")
        if resource == "broker":
            if attribute is not None:
                getter = BROKER_ATTRIBUTES.get(attribute)
                if getter is None:
                    raise RequestError(f"unknown broker attribute {attribute!r}")
                return getter(broker)
            args = _arguments(request)
            return _overload(BROKER_OPERATIONS, str(operation), args, "broker")(broker, args)
        if kind == "queue" and name:
            queue = broker.queues.get(name)
            if queue is None:
                raise NotFound(f"queue {name} does not exist")
            if attribute is not None:
                attributes = queue_attributes(broker, queue)
                if attribute not in attributes:
                    raise RequestError(f"unknown queue attribute {attribute!r}")
                return attributes[attribute]
            args = _arguments(request)
            return _overload(QUEUE_OPERATIONS, str(operation), args, "queue")(broker, name, args)
        if kind == "address" and name:
            attributes = _address_attributes(broker, name)
            if attribute is None:
                raise RequestError(f"unknown address operation {operation!r}")
            if attribute not in attributes:
                raise RequestError(f"unknown address attribute {attribute!r}")
            return attributes[attribute]
        raise RequestError(f"unknown resource {resource[:200]!r}")


def _usable_reply_to(reply_to: Any, wildcards: WildcardConfig) -> TypeGuard[str]:
    """A name the reply can be published to (B-150, not a wildcard: B-011) that is not the
    management address itself, however it is spelled (`activemq.management::q` too: the
    relay routes that to the management address, and the reply would come back as a
    request)."""
    if not isinstance(reply_to, str) or not reply_to:
        return False
    try:
        address = parse_address(reply_to).address
    except ClientError:
        return False
    return address != MANAGEMENT_ADDRESS and not wildcards.has_wildcard(address)


def _reply(correlation: Any, reply_to: str, succeeded: bool, text: str) -> Message:
    """The reply's sections: properties (to, correlation-id), application-properties
    (`_AMQ_OperationSucceeded`) and the amqp-value body; not durable."""
    data = b"".join(
        sections.encode_value(section)
        for section in (
            Described(ULong(_PROPERTIES), [None, None, reply_to, None, None, correlation]),
            Described(ULong(_APPLICATION_PROPERTIES), {SUCCEEDED: succeeded}),
            Described(ULong(_AMQP_VALUE), text),
        )
    )
    scanned = sections.scan(data)
    return Message(data, head_end=scanned.head_end(), reader=sections.READER)


__all__ = [
    "BROKER_OPERATIONS",
    "QUEUE_OPERATIONS",
    "AmqpManagement",
    "RequestError",
]
