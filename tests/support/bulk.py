"""Many messages quickly with a real AMQP client (proton's reactor, a credit window of
sends in flight), for the paging tests' large backlogs (issue 23).

Bodies are `b"%08d" % i` padded to `size` bytes, so a receiver can tell order, loss and
duplicates from the numbers alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from support.client import Browse, Capabilities


def body(i: int, size: int) -> bytes:
    head = b"%08d" % i
    return head + b"x" * max(size - len(head), 0)


class _Sender(MessagingHandler):  # type: ignore[misc]
    def __init__(
        self,
        url: str,
        address: str,
        numbers: range,
        *,
        size: int,
        durable: Callable[[int], bool],
        on_accepted: Callable[[int], None] | None,
        ttl_s: float | None = None,
        properties: Callable[[int], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.url, self.address, self.numbers = url, address, numbers
        self.size, self.durable, self.on_accepted_count = size, durable, on_accepted
        self.ttl_s = ttl_s
        self.properties = properties
        self.next = 0
        self.accepted = 0
        self.error: str | None = None

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        event.container.create_sender(conn, self.address, options=Capabilities("queue"))

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.next < len(self.numbers):
            i = self.numbers[self.next]
            message = Message(body=body(i, self.size), durable=self.durable(i))
            if self.ttl_s is not None:
                message.ttl = self.ttl_s
            if self.properties is not None:
                message.properties = self.properties(i)
            sender.send(message)
            self.next += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.on_accepted_count is not None:
            self.on_accepted_count(self.accepted)
        if self.accepted == len(self.numbers):
            event.connection.close()

    def on_rejected(self, event: Any) -> None:
        self.error = f"rejected: {event.delivery.remote.condition}"
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport error: {event.transport.condition}"

    def on_disconnected(self, event: Any) -> None:
        if self.accepted < len(self.numbers):
            self.error = self.error or "disconnected"
        event.container.stop()


def send(
    url: str,
    address: str,
    numbers: range,
    *,
    size: int = 1024,
    durable: Callable[[int], bool] = lambda i: True,
    on_accepted: Callable[[int], None] | None = None,
    ttl_s: float | None = None,
    properties: Callable[[int], dict[str, Any]] | None = None,
) -> int:
    """Send messages `numbers` to the anycast queue `address`; how many were accepted
    (all, unless the connection dropped: `on_accepted(count)` may kill the broker).
    `properties(i)`: the application-properties of message i (for selectors)."""
    sender = _Sender(
        url,
        address,
        numbers,
        size=size,
        durable=durable,
        on_accepted=on_accepted,
        ttl_s=ttl_s,
        properties=properties,
    )
    Container(sender).run()
    if sender.error is not None and on_accepted is None:
        raise AssertionError(f"sending to {address}: {sender.error}")
    return sender.accepted


class _Receiver(MessagingHandler):  # type: ignore[misc]
    def __init__(
        self,
        url: str,
        address: str,
        count: int,
        on_message: Callable[[int], None],
        *,
        browse: bool = False,
    ):
        super().__init__(prefetch=500)
        self.url, self.address, self.count = url, address, count
        self.callback = on_message
        self.browse = browse
        self.got: list[int] = []

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        options = [Capabilities("queue"), Browse()] if self.browse else Capabilities("queue")
        event.container.create_receiver(conn, self.address, options=options)

    def on_message(self, event: Any) -> None:
        self.got.append(int(bytes(event.message.body[:8])))
        self.callback(len(self.got))
        if len(self.got) >= self.count:
            event.receiver.close()
            event.connection.close()

    def on_disconnected(self, event: Any) -> None:
        event.container.stop()


def receive(
    url: str, address: str, count: int, *, on_message: Callable[[int], None] = lambda n: None
) -> list[int]:
    """Accept `count` messages from the anycast queue `address` (or until the connection
    drops); their numbers in arrival order."""
    receiver = _Receiver(url, address, count, on_message)
    Container(receiver).run()
    return receiver.got


def browse(url: str, address: str, count: int) -> list[int]:
    """Browse (distribution-mode copy, B-031) `count` messages of the anycast queue
    `address` (or until the connection drops); their numbers in arrival order."""
    receiver = _Receiver(url, address, count, lambda n: None, browse=True)
    Container(receiver).run()
    return receiver.got
