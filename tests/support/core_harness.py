"""`Harness`: drives a core `Broker` the way the protocol adapter does, with a ManualClock."""

from __future__ import annotations

from random import Random
from typing import Any

from amqpbroker.core import (
    AddressSettings,
    Broker,
    CloseConnection,
    CloseConsumer,
    ConnectionId,
    ConsumerId,
    ConsumerRequest,
    Dispatch,
    Drained,
    ManualClock,
    Message,
    Outcome,
    ProducerRequest,
    ProducerTarget,
    SettingsRepository,
)

CONN = ConnectionId(1)


class Harness:
    """Drives a Broker like the protocol adapter would, and records its dispatches."""

    def __init__(self, settings: dict[str, AddressSettings] | None = None, **kw: Any) -> None:
        self.clock = ManualClock()
        self.broker = Broker(
            settings=SettingsRepository(settings or {}), clock=self.clock, rng=Random(0), **kw
        )
        self.inbox: dict[ConsumerId, list[Dispatch]] = {}
        self.drained: list[ConsumerId] = []
        self.closed: list[CloseConsumer] = []
        self.killed: list[CloseConnection] = []  # connections the broker closed
        self._links = 0

    def producer(
        self, address: str | None, *caps: str, conn: ConnectionId = CONN, dynamic: bool = False
    ) -> ProducerTarget:
        return self.broker.attach_producer(
            ProducerRequest(connection=conn, address=address, capabilities=caps, dynamic=dynamic)
        )

    def send(
        self, target: ProducerTarget, body: bytes = b"m", *, priority: int = 4, **kw: Any
    ) -> Message:
        message = Message(
            body,
            priority=priority,
            application_properties=kw.pop("props", {}),
            ttl_ms=kw.pop("ttl_ms", None),
            expiration_ms=kw.pop("expiration_ms", 0),
            durable=kw.pop("durable", False),
            annotations={},
            properties=kw.pop("properties", {}),
            group_id=kw.pop("group_id", None),
            group_sequence=kw.pop("group_sequence", 0),
        )
        self.broker.publish(message, target, **kw)
        self._collect()
        return message

    def consumer(
        self,
        address: str | None,
        *caps: str,
        credit: int = 100,
        conn: ConnectionId = CONN,
        container: str = "c1",
        name: str | None = None,
        **kw: Any,
    ) -> ConsumerId:
        self._links += 1
        attached = self.broker.attach_consumer(
            ConsumerRequest(
                connection=conn,
                container_id=container,
                link_name=name or f"link{self._links}",
                address=address,
                capabilities=caps,
                **kw,
            )
        )
        self.inbox.setdefault(attached.consumer, [])
        if credit:
            self.broker.set_credit(attached.consumer, credit)
        self._collect()
        return attached.consumer

    def _collect(self) -> None:
        for effect in self.broker.take_effects():
            if isinstance(effect, Dispatch):
                self.inbox.setdefault(effect.consumer, []).append(effect)
            elif isinstance(effect, Drained):
                self.drained.append(effect.consumer)
            elif isinstance(effect, CloseConsumer):
                self.closed.append(effect)
            elif isinstance(effect, CloseConnection):
                self.killed.append(effect)

    def take(self, consumer: ConsumerId) -> list[Dispatch]:
        self._collect()
        got, self.inbox[consumer] = self.inbox.get(consumer, []), []
        return got

    def settle(self, consumer: ConsumerId, dispatch: Dispatch, outcome: Outcome) -> None:
        self.broker.settle(consumer, dispatch.delivery, outcome)
        self._collect()

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.broker.tick()
        self._collect()

    def queue(self, name: str):  # type: ignore[no-untyped-def]
        return self.broker.queues[name]


def bodies(dispatches: list[Dispatch]) -> list[bytes]:
    return [d.message.data for d in dispatches]


def one_delivery(h: Harness, **kw: Any) -> tuple[ConsumerId, Dispatch]:
    h.send(h.producer("q", "queue"))
    c = h.consumer("q", "queue", **kw)
    [d] = h.take(c)
    return c, d
