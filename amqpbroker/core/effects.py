"""Effects: what the core asks the shell to do, as data, in the order it must happen."""

from __future__ import annotations

from dataclasses import dataclass

from amqpbroker.core.model import ConnectionId, ConsumerId, DeliveryId, Message


class Dispatch:
    """Send `message` to `consumer` as delivery `delivery`.

    `wire_count` is the header delivery-count the consumer must see (B-050): the number
    of failed attempts before this one. `settled`: pre-settled transfer (B-037).
    """

    __slots__ = ("consumer", "delivery", "message", "settled", "wire_count")

    def __init__(
        self,
        consumer: ConsumerId,
        delivery: DeliveryId,
        message: Message,
        wire_count: int,
        settled: bool,
    ) -> None:
        self.consumer = consumer
        self.delivery = delivery
        self.message = message
        self.wire_count = wire_count
        self.settled = settled

    def __repr__(self) -> str:
        return (
            f"Dispatch(c={self.consumer}, d={self.delivery}, {self.message!r}, n={self.wire_count})"
        )


@dataclass(frozen=True, slots=True)
class Drained:
    """The consumer asked to drain and nothing is left to send: its credit is used up."""

    consumer: ConsumerId


@dataclass(frozen=True, slots=True)
class CloseConsumer:
    """Detach a consumer link from the broker side (queue deleted: B-038)."""

    consumer: ConsumerId
    condition: str
    description: str


@dataclass(frozen=True, slots=True)
class AddressUnblocked:
    """An address full under policy BLOCK has room again: producers may get credit.
    None: the broker is under `global-max-size` again (B-151: every producer, relays too)."""

    address: str | None


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close a client's connection with an error (a slow consumer's KILL policy,
    core/slowconsumer.py): its consumers' unacknowledged messages go back to their queues."""

    connection: ConnectionId
    condition: str
    description: str


Effect = Dispatch | Drained | CloseConsumer | AddressUnblocked | CloseConnection
