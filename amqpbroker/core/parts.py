"""What every part of the Broker may call on the whole, declared once.

Theory of operation
-------------------
`Broker` (core/broker.py) is a facade over mixins, one per policy: `_Attach`
(attach.py), `_Moving` (moving.py), `_Reaper` (reaper.py), `_Retroactive`
(retroactive.py), `_SlowConsumers` (slowconsumer.py). A mixin calls methods that live in
`Broker` itself; for mypy --strict each such method must be declared on the mixin. The
ones several mixins call are declared here, once, on the base every mixin shares; it
sits last in `Broker`'s method order, so the real method always wins. A method only one
mixin calls stays declared in that mixin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from amqpbroker.core.clock import Clock, Moment
from amqpbroker.core.model import ConnectionId, QueueConfig, RoutingType
from amqpbroker.core.postoffice import Address, PostOffice
from amqpbroker.core.queue import Queue
from amqpbroker.core.settings import ResolvedSettings, SettingsRepository


class _BrokerPart:
    """The state and the `Broker` methods shared by its mixins (set in Broker.__init__)."""

    moment: Moment  # the call's time and `in_call` (core/clock.py)
    post_office: PostOffice
    queues: dict[str, Queue]
    settings: SettingsRepository

    @property
    def clock(self) -> Clock:
        raise NotImplementedError  # Broker's

    @property
    def in_call(self) -> bool:
        raise NotImplementedError  # Broker's

    @property
    def now_ms(self) -> int:
        raise NotImplementedError  # Broker's

    @contextlib.contextmanager
    def _acting_for(self, user: str | None, roles: frozenset[str] | None) -> Iterator[None]:
        raise NotImplementedError  # Broker's

    def _auto_queue(
        self,
        name: str,
        address: str,
        routing_type: RoutingType,
        settings: ResolvedSettings,
        **overrides: Any,
    ) -> Queue:
        raise NotImplementedError  # Broker's

    def _remove_address(self, name: str) -> None:
        raise NotImplementedError  # Broker's

    def create_address(
        self,
        name: str,
        routing_types: set[RoutingType],
        *,
        auto_created: bool = False,
        temporary: bool = False,
        owner: ConnectionId | None = None,
    ) -> Address:
        raise NotImplementedError  # Broker's

    def create_queue(self, config: QueueConfig, *, owner: ConnectionId | None = None) -> Queue:
        raise NotImplementedError  # Broker's

    def delete_queue(self, name: str, *, reason: str = "deleted") -> None:
        raise NotImplementedError  # Broker's
