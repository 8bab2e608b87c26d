"""A thin AMQP test client over python-qpid-proton's BlockingConnection."""

from __future__ import annotations

import uuid
from typing import Any

from proton import Data, Delivery, Message, Terminus, symbol
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


# The terminus capabilities tests use most (B-008): the one definition of each.
QUEUE = Capabilities("queue")
TOPIC = Capabilities("topic")


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


def drain_round(conn: BlockingConnection, receiver: BlockingReceiver, credit: int) -> list[Message]:
    """Grant `credit` with the drain flag (B-037) and return what the broker sent for it,
    unsettled, in order. The broker answers a drain at once: messages up to the credit,
    then a flow that spends the rest, so fewer than `credit` means the queue had no more
    ready. Deterministic: no wait for silence. `receiver` must have no prefetch
    (`create_receiver` without `credit`), or proton would top its credit up."""
    link = receiver.link
    fetcher = receiver.fetcher
    assert fetcher is not None
    link.drain(credit)
    conn.wait(
        lambda: link.credit == 0 and not link.queued,
        msg=f"the broker to answer a drain on {link.source.address}",
    )
    link.drain_mode = False
    got = []
    while fetcher.has_message:
        got.append(fetcher.pop())  # not receive(): it would grant a credit
    return got


def is_empty(conn: BlockingConnection, address: str) -> bool:
    """Whether the anycast queue `address` has no message ready for a new consumer, asked
    with a credit drain (B-037). A message it had is returned to it, uncounted (B-053)."""
    receiver = conn.create_receiver(address, name=f"is-empty-{uuid.uuid4()}", options=QUEUE)
    try:
        return not drain_round(conn, receiver, 1)
    finally:
        receiver.close()


def nothing_more(conn: BlockingConnection, receiver: BlockingReceiver) -> bool:
    """Whether `receiver` (with credit) has nothing more coming: nothing received and not
    yet taken, and its queue has nothing ready (`is_empty`: a round trip on the same
    connection, so whatever the broker dispatched before its answer has arrived)."""
    assert receiver.fetcher is not None
    return is_empty(conn, receiver.link.source.address) and not receiver.fetcher.has_message


def drain(
    url: str, address: str, *, first_timeout: float = 10, credit: int = 100
) -> list[tuple[Any, int]]:
    """Accept everything an anycast queue holds: (body, delivery-count) in order.

    Rounds of credit drain (B-037) until a round comes back short: the queue is empty
    when the broker says so, not after a silence. `first_timeout` bounds each round."""
    conn = connect(url, timeout=first_timeout)
    got = []
    try:
        receiver = conn.create_receiver(address, options=QUEUE)
        while True:
            batch = drain_round(conn, receiver, credit)
            for message in batch:
                got.append((message.body, message.delivery_count))
                receiver.accept()
            if len(batch) < credit:
                break
    finally:
        conn.close()
    return got


class ConsumerPriority(LinkOption):
    """The attach property `priority` of a consumer link (B-035)."""

    def __init__(self, priority: int) -> None:
        self.priority = priority

    def apply(self, link: Any) -> None:
        link.properties = {symbol("priority"): self.priority}
