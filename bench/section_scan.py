"""Why the section scanner is hand-written: `amqp.sections.scan` vs `proton.Message.decode`.

    PYTHONPATH=$PWD .venv/bin/python bench/section_scan.py

One 1 KiB message as a client sends it (durable header, message-annotations, properties,
application-properties, a string body), then per message, best of 5 runs:

* `scan`: what the broker does on every transfer (section boundaries, the header fields,
  absolute-expiry-time; the body is skipped, not decoded);
* `decode`: `proton.Message().decode(raw)` and reading the same fields;
* `decode+encode`: the same plus `encode()`, which forwarding a decoded message needs (the
  scanner forwards the bytes as received, re-encoding only the header on a redelivery).
"""

from __future__ import annotations

import timeit

from proton import Message, symbol

from amqpbroker.amqp import sections


def _message() -> bytes:
    message = Message(
        body="x" * 841,
        durable=True,
        priority=6,
        ttl=60.0,
        id="order-42",
        address="orders",
        subject="created",
        content_type="text/plain",
        properties={"customer": "c-17", "amount": 1999, "region": "eu-west"},
    )
    message.annotations = {symbol("x-opt-jms-msg-type"): 5, symbol("x-opt-app"): "shop"}
    return bytes(message.encode())


RAW = _message()


def scan() -> tuple[object, ...]:
    s = sections.scan(RAW)
    return (
        s.durable,
        s.priority,
        s.ttl,
        s.delivery_count,
        s.first_acquirer,
        s.absolute_expiry_time,
        s.header_end,
        s.head_end(),
    )


def decode() -> tuple[object, ...]:
    m = Message()
    m.decode(RAW)
    return (m.durable, m.priority, m.ttl, m.delivery_count, m.first_acquirer, m.expiry_time)


def decode_encode() -> bytes:
    m = Message()
    m.decode(RAW)
    _ = (m.durable, m.priority, m.ttl, m.delivery_count, m.first_acquirer, m.expiry_time)
    return bytes(m.encode())


def per_message_us(fn: object, number: int = 20_000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


if __name__ == "__main__":
    print(f"message: {len(RAW)} bytes")
    for name, fn in (("scan", scan), ("decode", decode), ("decode+encode", decode_encode)):
        print(f"{name:>14}: {per_message_us(fn):6.2f} us/message")
