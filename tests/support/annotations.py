"""Read a stored message's annotations with Qpid Proton as the oracle (AMQP types too)."""

from __future__ import annotations

from proton import Data

from amqpbroker.amqp import sections


def annotation_types(data: bytes) -> dict[str, tuple[int, object]]:
    """{key: (proton `Data` type, value)} of the message-annotations of `data`; every key
    must be a symbol."""
    found = sections.scan(data).message_annotations
    assert found is not None, "no message-annotations section"
    start, end = found
    decoded = Data()
    decoded.decode(data[start + 3 : end])  # skip the section descriptor
    decoded.rewind()
    decoded.next()
    decoded.enter()
    types: dict[str, tuple[int, object]] = {}
    while decoded.next():
        assert decoded.type() == Data.SYMBOL
        key = str(decoded.get_symbol())
        decoded.next()
        types[key] = (decoded.type(), decoded.get_object())
    return types
