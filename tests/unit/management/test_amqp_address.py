"""The AMQP management address without sockets (issue 19, B-160): requests encoded by
proton, handled by a core broker, replies decoded by proton."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from proton import Message as ProtonMessage
from support.core_harness import CONN, Harness

from amqpbroker.amqp import sections
from amqpbroker.core import Message, ProducerRequest, ProducerTarget
from amqpbroker.management import AmqpManagement


def setup() -> tuple[Harness, ProducerTarget]:
    """A broker serving the management address, with the reply queue `r`."""
    h = Harness()
    h.broker.management = AmqpManagement(h.broker)
    h.producer("r", "queue")
    request = ProducerRequest(connection=CONN, address="activemq.management")
    return h, h.broker.attach_producer(request)


def request(h: Harness, target: ProducerTarget, **fields: Any) -> list[ProtonMessage]:
    """Send one request; the replies that reached queue `r`."""
    fields.setdefault("reply_to", "r")
    raw = bytes(ProtonMessage(**fields).encode())  # proton encodes a bytearray
    scanned = sections.scan(raw)
    message = Message(
        scanned.data,
        header_end=scanned.header_end,
        head_end=scanned.head_end(),
        reader=sections.READER,
    )
    h.broker.publish(message, target)
    c = h.consumer("r", "queue")
    replies = []
    for d in h.take(c):
        reply = ProtonMessage()
        reply.decode(d.message.data)
        replies.append(reply)
    h.broker.detach_consumer(c, closed=True)
    return replies


@pytest.mark.parametrize(
    "message_id",
    [7, uuid.UUID(int=5), b"\x00\x01", "text-id"],
    ids=["ulong", "uuid", "binary", "string"],
)
def test_correlation_id_keeps_the_message_id_type(message_id: Any) -> None:
    """B-160: the reply's correlation-id is the request's message-id, same AMQP type."""
    h, target = setup()
    props = {"_AMQ_ResourceName": "broker", "_AMQ_Attribute": "name"}
    (reply,) = request(h, target, id=message_id, properties=props, body="[]")
    assert reply.correlation_id == message_id
    assert reply.properties == {"_AMQ_OperationSucceeded": True}
    assert json.loads(reply.body) == ["amqpbroker"]


def test_a_data_body_holding_json_is_read_too() -> None:
    """Some clients send the JSON array as a data section: read as UTF-8."""
    h, target = setup()
    props = {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "getQueueNames"}
    (reply,) = request(h, target, id=1, properties=props, body=b'["ANYCAST"]')
    assert json.loads(reply.body) == [["r"]]


@pytest.mark.parametrize(
    ("props", "body"),
    [
        ({"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "getQueueNames"}, b"\xff\xfe"),
        ({"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "getQueueNames"}, ["a"]),
        ({"_AMQ_ResourceName": ["broker"], "_AMQ_Attribute": "name"}, "[]"),
        ({"_AMQ_ResourceName": "queue.", "_AMQ_Attribute": "name"}, "[]"),
        ({"_AMQ_ResourceName": "address.r", "_AMQ_OperationName": "x"}, "[]"),
        ({"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "createAddress"}, '["a", 5]'),
        (
            {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "createAddress"},
            '["a.#", "ANYCAST"]',
        ),
        (
            {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "addAddressSettings"},
            '["#", "[]"]',
        ),
        ({"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "listQueues"}, '["{}", true, 1]'),
    ],
)
def test_a_request_not_understood_gets_a_failure_reply(props: dict[str, Any], body: Any) -> None:
    """B-153/B-160: `_AMQ_OperationSucceeded` false with the reason, nothing raised."""
    h, target = setup()
    (reply,) = request(h, target, id=1, properties=props, body=body)
    assert reply.properties == {"_AMQ_OperationSucceeded": False}
    (text,) = json.loads(reply.body)
    assert isinstance(text, str)
    assert text


def test_without_reply_to_the_request_is_dropped_and_not_run() -> None:
    """docs/decisions.md: nobody could read the answer, so nothing is done."""
    h, target = setup()
    h.send(h.producer("q", "queue"), b"a")
    props = {"_AMQ_ResourceName": "queue.q", "_AMQ_OperationName": "removeAllMessages"}
    assert request(h, target, id=1, properties=props, body="[]", reply_to=None) == []
    assert h.queue("q").message_count == 1


def test_create_queue_never_makes_the_management_address() -> None:
    """B-160/B-110: the management address never exists (requests to it are answered,
    never routed), so createQueue may not create it with auto-create-address, as
    createAddress may not; a consumer could otherwise attach to a queue on it."""
    h, target = setup()
    spec = {"name": "m", "address": "activemq.management", "routingType": "ANYCAST"}
    props = {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "createQueue"}
    body = json.dumps([json.dumps({**spec, "autoCreateAddress": True})])
    (reply,) = request(h, target, id=1, properties=props, body=body)
    assert reply.properties == {"_AMQ_OperationSucceeded": False}
    assert "management address" in json.loads(reply.body)[0]
    assert "activemq.management" not in h.broker.post_office.addresses
    assert "m" not in h.broker.queues


def test_a_reply_to_naming_the_management_address_as_a_queue_is_dropped() -> None:
    """B-160, docs/decisions.md (no loop): `activemq.management::x` is the management
    address too (the relay parses it so), so the request is dropped and not run; the
    reply was handed back to the handler as a request of the broker's own."""
    h, target = setup()
    handled: list[Message] = []
    handler = h.broker.management
    assert handler is not None

    class Counting:
        def handle(self, request: Message, sender: ProducerTarget) -> None:
            handled.append(request)
            handler.handle(request, sender)

    h.broker.management = Counting()
    h.send(h.producer("q", "queue"), b"a")
    props = {"_AMQ_ResourceName": "queue.q", "_AMQ_OperationName": "removeAllMessages"}
    reply_to = "activemq.management::x"
    assert request(h, target, id=1, properties=props, body="[]", reply_to=reply_to) == []
    assert len(handled) == 1
    assert h.queue("q").message_count == 1


@pytest.mark.parametrize("reply_to", ["replies.#", "replies.*", "bad\x01name", "a::b::c"])
def test_a_reply_to_the_reply_cannot_be_sent_to_is_dropped_and_not_run(reply_to: str) -> None:
    """docs/decisions.md (no reply-to: dropped, not run): a wildcard reply-to (B-011: never
    sent to) or a name the broker refuses (B-150) is no more usable than none; the
    operation ran and its reply was lost."""
    h, target = setup()
    h.send(h.producer("q", "queue"), b"a")
    props = {"_AMQ_ResourceName": "queue.q", "_AMQ_OperationName": "removeAllMessages"}
    assert request(h, target, id=1, properties=props, body="[]", reply_to=reply_to) == []
    assert h.queue("q").message_count == 1


@pytest.mark.parametrize(
    ("operation", "body"),
    [
        ("createAddress", '["a\\udc80", "ANYCAST"]'),
        ("createQueue", '["{\\"name\\": \\"q\\", \\"filter\\": \\"a = \'\\\\udc80\'\\"}"]'),
        ("addAddressSettings", '["#", "{\\"deadLetterAddress\\": \\"\\\\ud800\\"}"]'),
    ],
    ids=["address-name", "queue-filter", "settings-value"],
)
def test_a_lone_surrogate_in_a_request_string_is_refused(operation: str, body: str) -> None:
    """Issue 15 attack: JSON escapes spell lone surrogates, which no UTF-8 encoder takes;
    an address created with one failed the journal's encoding (every durable send refused
    until a restart) and every /metrics scrape. Such a request is not understood now,
    also in the JSON text an argument carries, and nothing is created."""
    h, target = setup()
    addresses = set(h.broker.post_office.addresses)
    patterns = set(h.broker.settings.patterns)
    props = {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": operation}
    (reply,) = request(h, target, id=1, properties=props, body=body)
    assert reply.properties == {"_AMQ_OperationSucceeded": False}
    assert "not Unicode text" in json.loads(reply.body)[0]
    assert set(h.broker.post_office.addresses) == addresses
    assert "q" not in h.broker.queues
    assert set(h.broker.settings.patterns) == patterns


@pytest.mark.parametrize(
    ("operation", "args", "refusal"),
    [
        (
            "addAddressSettings",
            ["#", json.dumps({f"k{i}": i for i in range(50_000)})],
            "more than 100 keys",
        ),
        (
            "createQueue",
            [json.dumps({"name": "q", "ringSize": [[[[[1]]]]] * 1000})],
            "must be a string, number, boolean or null",
        ),
        ("createAddress", ["a" * 70_000, "ANYCAST"], "over 65536 bytes"),
    ],
    ids=["many-keys", "nested-value", "long-name"],
)
def test_what_the_config_loader_is_handed_is_bounded(
    operation: str, args: list[Any], refusal: str
) -> None:
    """Issue 15 attack: the config loader (PyYAML, pure Python, on the event loop) took
    9 s for an addAddressSettings of 50,000 unknown keys and ~30 s for nested lists
    within the 1 MiB request limit, every connection stalled. A queue configuration or
    address-settings entry is now at most 100 scalars and 64 KiB, refused before the
    loader sees it."""
    h, target = setup()
    props = {"_AMQ_ResourceName": "broker", "_AMQ_OperationName": operation}
    (reply,) = request(h, target, id=1, properties=props, body=json.dumps(args))
    assert reply.properties == {"_AMQ_OperationSucceeded": False}
    assert refusal in json.loads(reply.body)[0]
    assert "q" not in h.broker.queues
