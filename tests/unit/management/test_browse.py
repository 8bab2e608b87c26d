"""A message that cannot be decoded never makes its queue unbrowsable (issue 15)."""

from __future__ import annotations

import json
import struct
from http import HTTPStatus

from support.core_harness import Harness
from support.hostile import nested_list
from support.http import InlineBridge

from amqpbroker.core import Message
from amqpbroker.management import ManagementApi
from amqpbroker.protocol import sections

MESSAGE_ANNOTATIONS = b"\x00\x53\x72"
AMQP_VALUE = b"\x00\x53\x77"


def annotations_holding(value: bytes) -> bytes:
    key = sections.encode_value(sections.Symbol("x-deep"))
    body = key + value
    return MESSAGE_ANNOTATIONS + b"\xd1" + struct.pack(">II", len(body) + 4, 2) + body


def browse(h: Harness) -> list[dict[str, object]]:
    api = ManagementApi(InlineBridge(), metrics=bytes, healthy=lambda: True)
    api.bridge_broker = h.broker
    reply = api.respond(
        "GET", "/api/v1/queues/Q/messages", authorization=None, client="c", read_body=bytes
    )
    assert reply.status == HTTPStatus.OK, reply.body
    views: list[dict[str, object]] = json.loads(reply.body)
    return views


def publish(h: Harness, data: bytes) -> None:
    target = h.producer("Q", "queue")
    h.broker.publish(Message(data, reader=sections.READER, durable=True), target)


def test_messages_nested_10000_deep_are_shown_undecoded() -> None:
    """Issue 15: nested annotations or body: 200, `decode_error` and the Ref's fields."""
    h = Harness()
    publish(h, annotations_holding(nested_list(10_000)) + AMQP_VALUE + sections.encode_value("a"))
    publish(h, AMQP_VALUE + nested_list(10_000))
    publish(h, AMQP_VALUE + sections.encode_value("fine"))
    deep_annotations, deep_body, fine = browse(h)
    assert deep_annotations["message_annotations"] == {}
    assert "message_annotations" in str(deep_annotations["decode_error"])
    # The scanner refuses the whole message (issue 15: deeper than MAX_DEPTH), so
    # its body cannot be located either: shown unreadable, with the reason.
    assert deep_annotations["body_preview"] == "<unreadable body>"
    assert deep_annotations["durable"] is True
    assert deep_annotations["size"] > 90_000  # type: ignore[operator]
    assert deep_body["body_preview"] == "<unreadable body>"
    assert str(deep_body["decode_error"]).startswith("body: ")
    assert fine["body_preview"] == "fine"
    assert "decode_error" not in fine
    assert [m["msg_id"] for m in (deep_annotations, deep_body, fine)] == sorted(
        m["msg_id"]  # type: ignore[misc]
        for m in (deep_annotations, deep_body, fine)
    )


def test_values_that_decode_but_nest_deep_are_cut_for_json() -> None:
    """A value the decoder accepts (30 deep, under MAX_DEPTH) is shown down to a bounded
    depth."""
    h = Harness()
    publish(h, annotations_holding(nested_list(30)) + AMQP_VALUE + nested_list(30))
    [view] = browse(h)
    shown = view["message_annotations"]["x-deep"]  # type: ignore[index]
    depth = 0
    while isinstance(shown, list):
        shown, depth = shown[0], depth + 1
    assert shown == "…"
    assert depth < 20
    assert view["body_preview"].startswith("[[[")  # type: ignore[union-attr]
