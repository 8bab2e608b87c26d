"""Counters that outlive their queues and addresses (issue 16 item 4).

A queue's counters go with it: when an auto-created queue is auto-deleted and created
again, its series starts over, and a burst before the first scrape of the new one is lost
to Prometheus's increase() (a queue fed 120 messages in 5 minutes showed 80). So the
counters of a deleted queue are kept per address name and added to the address's totals
while the broker runs, and an address's routed/unrouted counts carry over to its next
incarnation. Broker-wide totals add everything up and never decrease.

Bounded: at most `limit` addresses that no longer exist are remembered; beyond that the
oldest are folded into the broker-wide totals only (their per-address series end).
Temporary queues and addresses (dynamic nodes, names never reused) go there at once.

Loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from amqpbroker.core.postoffice import Address
from amqpbroker.core.queue import Queue, QueueCounters

RETIRED_ADDRESSES_MAX = 10_000


@dataclass(slots=True)
class BrokerStats:
    """Broker-wide counters (per-queue and per-address ones live with those)."""

    unrouted: int = 0
    routed: int = 0
    killed_no_dla: int = 0
    slow_consumers: dict[str, int] = field(default_factory=dict)  # by policy (issue 19)


class CounterTotals:
    """Per-address and broker-wide totals of queue counters, across incarnations."""

    def __init__(self, *, limit: int = RETIRED_ADDRESSES_MAX) -> None:
        self.limit = limit
        self._counters: dict[str, QueueCounters] = {}  # deleted queues', per address
        self._routing: dict[str, tuple[int, int]] = {}  # deleted addresses' routed/unrouted
        self._forgotten = QueueCounters()  # of addresses no longer remembered

    def queue_deleted(self, queue: Queue, alive: Callable[[str], bool]) -> None:
        if queue.config.temporary:
            self._forgotten.add(queue.counters)
            return
        kept = self._counters.pop(queue.address, None) or QueueCounters()
        kept.add(queue.counters)
        self._counters[queue.address] = kept  # now the most recent
        self._trim(alive)

    def address_deleted(self, address: Address, alive: Callable[[str], bool]) -> None:
        if not address.temporary and (address.routed or address.unrouted):
            self._routing.pop(address.name, None)
            self._routing[address.name] = (address.routed, address.unrouted)
            self._trim(alive)

    def address_created(self, address: Address) -> None:
        """A new incarnation continues the routed/unrouted counts of the last one."""
        previous = self._routing.pop(address.name, None)
        if previous is not None:
            address.routed, address.unrouted = previous

    def _trim(self, alive: Callable[[str], bool]) -> None:
        for table in (self._counters, self._routing):
            if len(table) <= self.limit:
                continue
            for name in [n for n in table if not alive(n)][: len(table) - self.limit]:
                value = table.pop(name)
                if isinstance(value, QueueCounters):
                    self._forgotten.add(value)

    def totals(self, queues: Iterable[Queue]) -> tuple[dict[str, QueueCounters], QueueCounters]:
        """(per address: its deleted queues' counters plus its live queues', broker-wide)."""
        per_address: dict[str, QueueCounters] = {}
        for name, counters in self._counters.items():
            per_address[name] = total = QueueCounters()
            total.add(counters)
        for queue in queues:
            found = per_address.get(queue.address)
            if found is None:
                found = per_address[queue.address] = QueueCounters()
            found.add(queue.counters)
        everything = QueueCounters()
        everything.add(self._forgotten)
        for counters in per_address.values():
            everything.add(counters)
        return per_address, everything
