"""A thin AMQP test client over python-qpid-proton's BlockingConnection."""

from __future__ import annotations

from typing import Any

from proton import Data, Delivery, Message, Terminus, Timeout, symbol
from proton.reactor import Filter, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender


class Capabilities(LinkOption):
    """Set terminus capabilities on the node the link talks to (B-008, B-024)."""

    def __init__(self, *caps: str) -> None:
        self.caps = caps

    def apply(self, link: Any) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.capabilities.put_array(False, Data.SYMBOL)
        terminus.capabilities.enter()
        for cap in self.caps:
            terminus.capabilities.put_symbol(cap)
        terminus.capabilities.exit()


class Durable(LinkOption):
    """A durable subscription source: durability unsettled-state, expiry never (B-026)."""

    def apply(self, link: Any) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


class Browse(LinkOption):
    """distribution-mode copy: a browser (B-031)."""

    def apply(self, link: Any) -> None:
        link.source.distribution_mode = Terminus.DIST_MODE_COPY


def selector(text: str) -> Filter:
    from proton import Described

    return Filter(
        {symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), text)}
    )


def connect(url: str, *, container: str | None = None, timeout: float = 10) -> BlockingConnection:
    kwargs: dict[str, Any] = {"timeout": timeout}
    if container is not None:
        kwargs["container_id"] = container
    return BlockingConnection(url, **kwargs)


def send(
    conn: BlockingConnection,
    address: str,
    *bodies: Any,
    caps: tuple[str, ...] = (),
    **message_fields: Any,
) -> None:
    sender: BlockingSender = conn.create_sender(
        address, options=[Capabilities(*caps)] if caps else None
    )
    for body in bodies:
        sender.send(Message(body=body, **message_fields))
    sender.close()


def receive_bodies(receiver: BlockingReceiver, count: int, *, timeout: float = 5) -> list[Any]:
    bodies = []
    for _ in range(count):
        bodies.append(receiver.receive(timeout=timeout).body)
        receiver.accept()
    return bodies


def settle_modified(
    receiver: BlockingReceiver, *, failed: bool = True, undeliverable: bool = False
) -> None:
    """Settle the oldest received message `modified` with these fields (B-043…B-045).

    `BlockingReceiver.release(delivered=True)` sends `modified` *without*
    delivery-failed, so the fields are set on the delivery here.
    """
    delivery = receiver.fetcher.unsettled[0]
    delivery.local.failed = failed
    delivery.local.undeliverable = undeliverable
    receiver.settle(Delivery.MODIFIED)


def reject_with(receiver: BlockingReceiver, condition: str, description: str) -> None:
    """Settle the oldest received message `rejected` with an error (B-046, B-079)."""
    from proton import Condition

    delivery = receiver.fetcher.unsettled[0]
    delivery.local.condition = Condition(condition, description)
    receiver.settle(Delivery.REJECTED)


def settle_as(receiver: BlockingReceiver, action: str, condition: str | None) -> None:
    """Settle the oldest received message as a scripted consumer says: "accept", "fail"
    (modified, delivery-failed) or, with a condition, a reject with `action` as its
    description."""
    if action == "accept":
        receiver.accept()
    elif action == "fail":
        settle_modified(receiver)
    else:
        reject_with(receiver, condition or "", action)


def drain(
    url: str, address: str, *, first_timeout: float = 2, credit: int = 100
) -> list[tuple[Any, int]]:
    """Accept everything an anycast queue holds: (body, delivery-count) in order.

    Waits `first_timeout` for the first message, then stops after 0.5 s of silence.
    """
    conn = connect(url)
    got = []
    timeout = first_timeout
    try:
        receiver = conn.create_receiver(address, credit=credit, options=Capabilities("queue"))
        while True:
            try:
                message = receiver.receive(timeout=timeout)
            except Timeout:
                break
            got.append((message.body, message.delivery_count))
            receiver.accept()
            timeout = 0.5
    finally:
        conn.close()
    return got


class ConsumerPriority(LinkOption):
    """The attach property `priority` of a consumer link (B-035)."""

    def __init__(self, priority: int) -> None:
        self.priority = priority

    def apply(self, link: Any) -> None:
        link.properties = {symbol("priority"): self.priority}
