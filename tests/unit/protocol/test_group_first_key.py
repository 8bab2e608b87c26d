"""`Copier.with_property`: the group-first-key copy of a message (B-127)."""

from __future__ import annotations

from proton import Message

from amqpbroker.amqp import sections
from amqpbroker.protocol.moves import COPIER
from amqpbroker.protocol.transfers import message_of


def test_with_property_adds_the_key_and_keeps_everything_else() -> None:
    """B-127 group-first-key: the delivered copy says `key: true` in its
    application-properties; header, properties, other entries and body are unchanged,
    and so is the original."""
    sent = Message(
        body="payload",
        id="m-1",
        durable=True,
        priority=6,
        group_id="G",
        properties={"colour": "red"},
    )
    original = message_of(sections.scan(bytes(sent.encode())))
    copy = COPIER.with_property(original, "JMSXGroupFirstForConsumer", True)
    got = Message()
    got.decode(copy.data)
    assert got.properties == {"colour": "red", "JMSXGroupFirstForConsumer": True}
    assert (got.body, got.id, got.durable, got.priority, got.group_id) == (
        "payload",
        "m-1",
        True,
        6,
        "G",
    )
    assert (copy.msg_id, copy.group_id) == (original.msg_id, "G")
    assert original.get_application_properties() == {"colour": "red"}


def test_with_property_creates_application_properties_when_absent() -> None:
    """B-127: a message without application-properties gets the section."""
    original = message_of(sections.scan(bytes(Message(body=b"\x01", group_id="G").encode())))
    copy = COPIER.with_property(original, "first", True)
    got = Message()
    got.decode(copy.data)
    assert (got.properties, got.body) == ({"first": True}, b"\x01")
