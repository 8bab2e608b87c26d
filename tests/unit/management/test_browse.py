"""A message that cannot be decoded never makes its queue unbrowsable (issue 15)."""

from __future__ import annotations

import json
import struct
from http import HTTPStatus

from support.core_harness import Harness
from support.hostile import nested_list
from support.http import InlineBridge

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings, Message
from amqpbroker.management import ManagementApi

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


APPLICATION_PROPERTIES = b"\x00\x53\x74"


def _strict_json(body: bytes) -> object:
    """JSON as a browser's `JSON.parse` reads it: no NaN or Infinity."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


def test_a_property_that_is_not_a_finite_number_is_browsed_as_valid_json() -> None:
    """Issue 15 attack (B-153): a double NaN or infinity in a message was written bare
    (`NaN`), which is not JSON: one producer made the queue's browse, in the console
    and any strict client, fail to parse. Such a number is shown as its JS spelling."""
    h = Harness()
    values = {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "one": 1.5}
    properties = APPLICATION_PROPERTIES + sections.encode_value(values)
    publish(h, properties + AMQP_VALUE + sections.encode_value([float("nan")]))
    api = ManagementApi(InlineBridge(), metrics=bytes, healthy=lambda: True)
    api.bridge_broker = h.broker
    reply = api.respond(
        "GET", "/api/v1/queues/Q/messages", authorization=None, client="c", read_body=bytes
    )
    [view] = _strict_json(reply.body)  # type: ignore[misc]
    assert view["application_properties"] == {
        "nan": "NaN",
        "inf": "Infinity",
        "ninf": "-Infinity",
        "one": 1.5,
    }
    assert view["body_preview"] == '["NaN"]'


def test_a_browse_lists_at_most_the_browse_page_size_whatever_the_limit() -> None:
    """B-160, issue 15 attack: `?limit=` took any number up to 18 digits, so one GET
    listed the whole queue, its paged messages read into memory together; it is held
    to `management-browse-page-size` as `listMessages` is, the total still counted."""
    h = Harness({"#": AddressSettings.of(management_browse_page_size=3)})
    for i in range(5):
        publish(h, AMQP_VALUE + sections.encode_value(f"m{i}"))
    api = ManagementApi(InlineBridge(), metrics=bytes, healthy=lambda: True)
    api.bridge_broker = h.broker
    reply = api.respond(
        "GET",
        "/api/v1/queues/Q/messages?limit=999999999999999999&offset=1",
        authorization=None,
        client="c",
        read_body=bytes,
    )
    assert reply.status == HTTPStatus.OK
    assert [v["body_preview"] for v in json.loads(reply.body)] == ["m1", "m2", "m3"]
    assert reply.headers is not None
    assert reply.headers["X-Total-Count"] == "5"
