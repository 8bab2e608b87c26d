"""The reaper: auto-deleting idle auto-created queues and addresses (B-111…B-114).

Theory of operation
-------------------
Every `address-queue-scan-period` the broker's `tick()` runs one `reap()` pass. A queue
qualifies when it was auto-created (not configured, not temporary), its settings ask for
`auto-delete-queues` (a queue created by management: its own `auto-delete`, which
`auto-delete-created-queues` gives by default), it has no consumer, no more than
`auto-delete-queues-message-count` messages, was used (or the usage check is skipped)
and has been idle for `auto-delete-queues-delay`; an address likewise, with no queue
left. Something is deleted only when it qualified on this pass *and* the previous one
(`swept`), so a queue that just lost its consumer survives one scan period.
"""

from __future__ import annotations

import logging

from amqpbroker.core.model import RoutingType
from amqpbroker.core.parts import _BrokerPart
from amqpbroker.core.postoffice import Address
from amqpbroker.core.queue import Queue

log = logging.getLogger("amqpbroker.core.broker")  # the broker's one logger

# `QueueConfig.extra` key of a queue created by management (B-162): its auto-delete.
CREATED_AUTO_DELETE = "auto-delete"


class _Reaper(_BrokerPart):
    """`Broker`'s auto-delete pass (a mixin: it declares the broker state it uses, which
    `Broker.__init__` sets)."""

    _retroactive: dict[str, dict[RoutingType, str]]

    def reap(self, now_ms: int) -> None:
        """One reaper pass: delete what qualified on this and the previous pass."""
        for queue in list(self.queues.values()):
            if self._queue_reapable(queue, now_ms):
                if queue.swept:
                    log.info("auto-deleting queue %s", queue.name)
                    self.delete_queue(queue.name, reason="auto-deleted")
                else:
                    queue.swept = True
            else:
                queue.swept = False
        for address in list(self.post_office.addresses.values()):
            if self._address_reapable(address, now_ms):
                if address.swept:
                    log.info("auto-deleting address %s", address.name)
                    self._remove_address(address.name)
                else:
                    address.swept = True
            else:
                address.swept = False

    def _queue_reapable(self, queue: Queue, now_ms: int) -> bool:
        config = queue.config
        if config.configured or config.temporary:
            return False
        settings = self.settings.resolve(queue.address)
        if config.auto_created:
            auto_delete = settings.auto_delete_queues
        else:  # created by management: decided at creation (B-113, B-162 createQueue)
            auto_delete = config.extra.get(CREATED_AUTO_DELETE) is True
        if not auto_delete or queue.consumers:
            return False
        limit = settings.auto_delete_queues_message_count
        if limit >= 0 and queue.message_count > limit:
            return False
        if not (queue.used or settings.auto_delete_queues_skip_usage_check):
            return False
        return now_ms - queue.idle_since_ms >= settings.auto_delete_queues_delay

    def _address_reapable(self, address: Address, now_ms: int) -> bool:
        if not address.auto_created or address.temporary or address.queues:
            return False
        if address.name in self._retroactive:
            return False  # its divert is a binding (B-124)
        settings = self.settings.resolve(address.name)
        if not settings.auto_delete_addresses:
            return False
        if not (address.used or settings.auto_delete_addresses_skip_usage_check):
            return False
        return now_ms - address.idle_since_ms >= settings.auto_delete_addresses_delay
