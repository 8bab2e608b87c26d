"""Addresses, bindings and routing (B-001…B-005, B-011).

An address has one or two routing types and the queues bound to it. Routing a message to
address A with effective routing type R (B-002): every filter-matching MULTICAST queue
gets a reference when R is MULTICAST or none; exactly one filter-matching ANYCAST queue
when R is ANYCAST or none, chosen round-robin with a preference for queues that have a
consumer able to take the message (B-003). MULTICAST queues bound to a wildcard address
(`news.#`) also receive messages sent to every concrete address it matches (B-011); an
ANYCAST queue on a wildcard address never competes with the concrete address's own queues
(issue 15: a consumer on `#` took every other message of every queue; docs/decisions.md).
"""

from __future__ import annotations

from amqpbroker.core.model import Message, RoutingType

# `Address` is defined in core/queue.py, whose `Memory` counts each message's bytes on it
# natively (issue 20); it is the post office's, and imported from here.
from amqpbroker.core.queue import Address as Address
from amqpbroker.core.queue import Queue
from amqpbroker.core.wildcard import WildcardConfig

_ANYCAST, _MULTICAST = RoutingType.ANYCAST, RoutingType.MULTICAST


class PostOffice:
    """Addresses by name and the routing of messages to their queues. Loop thread only."""

    def __init__(self, wildcards: WildcardConfig) -> None:
        self.wildcards = wildcards
        self.addresses: dict[str, Address] = {}
        self._wildcard_addresses: dict[str, Address] = {}
        self._matches_cache: dict[str, list[Address]] = {}

    def add(self, address: Address) -> None:
        self.addresses[address.name] = address
        if self.wildcards.has_wildcard(address.name):
            address.wildcard = True
            self._wildcard_addresses[address.name] = address
            self._matches_cache.clear()

    def remove(self, name: str) -> Address | None:
        address = self.addresses.pop(name, None)
        if address is not None and address.wildcard:
            del self._wildcard_addresses[name]
            self._matches_cache.clear()
        return address

    def _wildcard_matches(self, name: str) -> list[Address]:
        if not self._wildcard_addresses:
            return []
        hits = self._matches_cache.get(name)
        if hits is None:
            hits = [
                a
                for pattern, a in self._wildcard_addresses.items()
                if pattern != name and self.wildcards.matches(pattern, name)
            ]
            self._matches_cache[name] = hits
        return hits

    def route(
        self, message: Message, address: Address, routing_type: RoutingType | None
    ) -> list[Queue]:
        """The queues that get a reference (B-002); the caller adds the message to them.

        Per message and per queue (issue 20): the routing types are module constants (an
        enum member read through its class costs ~10x a global), and a queue without a
        filter or purge-on-no-consumers is taken without the `accepts_message` call."""
        targets: list[Queue] = []
        anycast: list[Queue] = []
        to_multicast = routing_type is not _ANYCAST
        to_anycast = routing_type is not _MULTICAST
        for queue in address.queues:
            if queue.routing_type is _MULTICAST:
                if not to_multicast:
                    continue
                chosen = targets
            elif to_anycast:
                chosen = anycast
            else:
                continue
            if (queue.selector is None and not queue.purging) or queue.accepts_message(message):
                chosen.append(queue)
        if to_multicast and self._wildcard_addresses:
            # Wildcard routing reaches subscriptions only (issue 15, decisions.md).
            for source in self._wildcard_matches(address.name):
                for queue in source.queues:
                    if queue.routing_type is _MULTICAST and queue.accepts_message(message):
                        targets.append(queue)
        if anycast:
            targets.append(
                anycast[0] if len(anycast) == 1 else self._pick_anycast(address, anycast, message)
            )
        return targets

    @staticmethod
    def _pick_anycast(address: Address, queues: list[Queue], message: Message) -> Queue:
        """B-003: from the rotating start, first queue with a consumer able to take it."""
        if len(queues) == 1:
            return queues[0]
        count = len(queues)
        start = address.anycast_start % count
        chosen = start
        for i in range(count):
            queue = queues[(start + i) % count]
            if any(
                not c.browser and (c.selector is None or c.selector.matches(message))
                for c in queue.consumers
            ):
                chosen = (start + i) % count
                break
        address.anycast_start = chosen + 1
        return queues[chosen]
