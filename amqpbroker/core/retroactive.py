"""Retroactive addresses (B-124): an address keeps its last R messages for queues to come.

Theory of operation
-------------------
When an address A is created and its `retroactive-message-count` R is > 0, the broker
creates, as Artemis `PostOfficeImpl.createRetroactiveResources` does:

* the address `$.artemis.internal.A.address.retro` (both routing types);
* on it two durable ring queues of size R (B-121) with max-consumers 0 (nobody consumes
  them, B-125): `$.artemis.internal.A.queue.anycast.retro` and `...queue.multicast.retro`;
* the non-exclusive divert `$.artemis.internal.A.divert.retro` from A to that address.

The divert is not an object here: `publish` gives every message routed to A by address
(not to a fully qualified queue, which bypasses bindings in Artemis too) a reference in
the ring queue of its routing type, or in both when it has none. Ring trimming keeps the
last R. A message that no queue of A took is still unrouted (B-004); it is kept all the
same, as the divert keeps it in Artemis.

When a queue is created on A, the kept messages of its routing type that pass its filter
are added to it, oldest first (event `enqueued`, reason `retroactive`), as Artemis
`ActiveMQServerImpl.copyRetroactiveMessages` does. The copies are references to the same
messages (same id), as a multicast route makes.

A has a binding while the divert exists, so the reaper never deletes it (B-114); deleting
A deletes its internal resources. The internal queues are durable: after a restart the
journal brings them back with their messages, and `create_address` finds them there.
A changed R (B-102) applies to the ring queues from the next message: raising it keeps
more; lowering it trims nothing (Artemis: "needs manual trimming", B-124), the queues
keep their length as messages arrive.

Loop thread only.
"""

from __future__ import annotations

from amqpbroker.core.effects import Effect
from amqpbroker.core.model import Message, QueueConfig, RoutingType
from amqpbroker.core.parts import _BrokerPart
from amqpbroker.core.postoffice import Address
from amqpbroker.core.queue import Queue
from amqpbroker.core.queuekinds import QueueKind
from amqpbroker.core.refs import GONE

# B-104 internal-naming-prefix (Artemis ActiveMQDefaultConfiguration).
INTERNAL_PREFIX = "$.artemis.internal."
_SUFFIX = "retro"  # Artemis ResourceNames.RETROACTIVE_SUFFIX


def retroactive_names(address: str, delimiter: str = ".") -> tuple[str, dict[RoutingType, str]]:
    """(internal address, {routing type: ring queue}) of address `address` (Artemis
    `ResourceNames.getRetroactiveResource*Name`)."""

    def name(resource: str) -> str:
        return delimiter.join((INTERNAL_PREFIX + address, resource, _SUFFIX))

    queues = {rt: name(delimiter.join(("queue", rt.value.lower()))) for rt in RoutingType}
    return name("address"), queues


def divert_name(address: str, delimiter: str = ".") -> str:
    """The name Artemis gives the divert (for logs and management)."""
    return delimiter.join((INTERNAL_PREFIX + address, "divert", _SUFFIX))


class _Retroactive(_BrokerPart):
    """`Broker`'s retroactive addresses (a mixin: it declares the broker state it uses,
    which `Broker.__init__` sets)."""

    _effects: list[Effect]
    # Address name -> its ring queue per routing type; empty: no retroactive address (the
    # one test `publish` pays).
    _retroactive: dict[str, dict[RoutingType, str]]

    def delete_address(self, name: str) -> None:
        raise NotImplementedError  # Broker's

    def _make_retroactive(self, address: Address) -> None:
        """B-124: create A's internal address and ring queues (or find them recovered)."""
        if address.temporary or address.wildcard or address.name.startswith(INTERNAL_PREFIX):
            return  # a wildcard address is a subscription pattern, never sent to (B-011)
        count = self.settings.resolve(address.name).retroactive_message_count
        if count <= 0:
            return
        internal, queue_names = retroactive_names(address.name, self.settings.wildcards.delimiter)
        self.create_address(internal, set(RoutingType))
        for routing_type, queue_name in queue_names.items():
            if queue_name not in self.queues:
                self.create_queue(
                    QueueConfig(
                        name=queue_name,
                        address=internal,
                        routing_type=routing_type,
                        durable=True,
                        max_consumers=0,
                        ring_size=count,
                    )
                )
        self._retroactive[address.name] = queue_names

    def _retain(self, message: Message, address: Address, routing_type: RoutingType | None) -> None:
        """The divert: a reference in the ring queue of the message's routing type."""
        queue_names = self._retroactive.get(address.name)
        if queue_names is None:
            return
        count = self.settings.resolve(address.name).retroactive_message_count
        for routing in (routing_type,) if routing_type is not None else address.routing_types:
            queue = self.queues.get(queue_names[routing])
            if queue is None:
                continue
            kind = queue.kind
            if isinstance(kind, QueueKind) and count > 0:
                kind.ring = count  # B-102: a changed count applies (lowering trims nothing)
            queue.add(message, self._effects)

    def _copy_retained(self, queue: Queue) -> None:
        """A new queue on a retroactive address gets the kept messages it accepts."""
        queue_names = self._retroactive.get(queue.address)
        if queue_names is None:
            return
        source = self.queues.get(queue_names[queue.routing_type])
        if source is None:
            return
        for ref in source.refs():
            if ref.state != GONE and queue.accepts_message(ref.message):
                queue.add(ref.message, self._effects, reason="retroactive")

    def _drop_retroactive(self, name: str) -> None:
        """A retroactive address was deleted: its divert and internal resources go too."""
        queue_names = self._retroactive.pop(name, None)
        if queue_names is not None:
            internal, _ = retroactive_names(name, self.settings.wildcards.delimiter)
            self.delete_address(internal)
