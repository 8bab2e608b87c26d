"""Moving messages out of their queue: dead letters (B-070…B-076) and expiry (B-084…B-087).

Theory of operation
-------------------
A message that has failed `max-delivery-attempts` times, or that a consumer rejected,
is dead-lettered (`dead_letter`); one past its expiration is expired (`expire_due`,
`expired`). Either way the reference leaves its queue and, when the address settings
name a dead-letter or expiry address, a *copy* of the message is routed there
(`_move_to_dla`): the copy carries `MoveAnnotations` (`core/moves.py`), written by the
injected `MessageCopier`; the target address and its `<prefix><origin><suffix>` queue
are made on first use when the settings ask for it (`_ensure_move_resources`,
B-074/B-086), acting for the broker, not the client. Without a dead-letter address the
message is dropped with a warning (B-071/B-072); an expired message with nowhere to go
is dropped, warned once per queue. Expiry is indexed (`track_expiry`): a heap of
(expiration, n, queue, ref), so a scan pops only what is due instead of walking every
message. The same copy path serves management moves (`copy_for_move`, `deliver_copy`,
`hop`). `_Moving` is a part of `Broker` (a mixin): it declares the broker state it uses,
which `Broker.__init__` sets.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from typing import Any

from amqpbroker.core.clock import entry, within_call
from amqpbroker.core.effects import Effect
from amqpbroker.core.ids import MessageIds
from amqpbroker.core.lifecycle import Emitter
from amqpbroker.core.model import (
    BYTE_OF_ROUTING_TYPE,
    ROUTING_TYPE_OF_BYTE,
    Message,
    annotated_routing_type,
)
from amqpbroker.core.moves import ORIG_ROUTING_TYPE, MessageCopier, MoveAnnotations
from amqpbroker.core.outcomes import Rejected
from amqpbroker.core.paging import PageStores
from amqpbroker.core.parts import _BrokerPart
from amqpbroker.core.postoffice import Address
from amqpbroker.core.queue import Queue
from amqpbroker.core.refs import Ref
from amqpbroker.core.settings import ResolvedSettings
from amqpbroker.core.totals import BrokerStats

log = logging.getLogger("amqpbroker.core.broker")  # the broker's one logger


class _Moving(_BrokerPart):
    """`Broker`'s dead letters, expiry and moved copies (a mixin: it declares the broker
    state it uses, which `Broker.__init__` sets)."""

    _effects: list[Effect]
    _expiries: list[tuple[int, int, Queue, Ref]]
    _expiry_drop_warned: set[str]
    _expiry_seq: itertools.count[int]
    _msg_ids: MessageIds
    page_stores: PageStores | None
    copier: MessageCopier
    emitter: Emitter
    stats: BrokerStats

    def _deliver_to(
        self,
        message: Message,
        address: Address,
        queues: list[Queue],
        now_ms: int,
        *,
        reason: str = "route",
    ) -> int:
        raise NotImplementedError  # Broker's

    def _set_expiration(self, message: Message, address: str, now_ms: int) -> None:
        raise NotImplementedError  # Broker's

    def dead_letter(self, queue: Queue, ref: Ref, reason: str, rejection: Rejected | None) -> None:
        """B-070…B-076: copy the message to the queue's DLA, or drop it (B-071/B-072)."""
        settings = self.settings.resolve(queue.address)
        message = ref.message
        dla = settings.dead_letter_address
        if not dla:
            self.stats.killed_no_dla += 1
            queue.killed(ref, "no-dla")
            log.warning(
                "dropping message %s from queue %s: %s and no dead-letter-address is set",
                message.msg_id,
                queue.name,
                reason
                if reason in ("rejected", "management")
                else f"max-delivery-attempts={settings.max_delivery_attempts} reached",
            )
            return
        queue.counters.dead_lettered += 1
        queue.counters.count(queue.counters.dead_lettered_by_reason, reason)
        move = self.hop(
            queue,
            message,
            dlq_reason=reason,
            dlq_error_condition=rejection.condition if rejection else None,
            dlq_error_description=rejection.description[:512]
            if rejection and rejection.description
            else None,
            dlq_delivery_count=ref.delivery_count,
        )
        if settings.auto_create_dead_letter_resources and queue.address != dla:
            self._ensure_move_resources(
                dla,
                queue.address,
                settings.dead_letter_queue_prefix,
                settings.dead_letter_queue_suffix,
            )
        copy = self._move_to_dla(message, queue.address, settings, move, queue=queue, ref=ref)
        if copy is None:
            queue.killed(ref, "dla-no-bindings")

    def dead_letter_waiting(self, queue: Queue, ref: Ref) -> None:
        """B-161 sendMessageToDeadLetterAddress: a waiting message dead-lettered now, as a
        delivery failure would (B-070), with reason `management` (B-171)."""
        queue.take(ref)
        queue.counters.killed += 1
        self.dead_letter(queue, ref, "management", None)

    def copy_for_move(self, message: Message, move: MoveAnnotations) -> Message:
        """A copy with a new id carrying `move` (B-076/B-090), not yet routed."""
        copy = self.copier.copy(message, move)
        copy.msg_id = next(self._msg_ids)
        copy.first_ts = message.first_ts
        return copy

    @entry
    def deliver_copy(
        self, copy: Message, address: str, queues: list[Queue], *, reason: str
    ) -> None:
        """Route a prepared copy to `queues` of `address` (overrides apply, B-082)."""
        copy.address = address
        now_ms = self.now_ms
        self._set_expiration(copy, address, now_ms)
        target = self.post_office.addresses.get(address)
        if target is not None:
            self._route_copy(copy, target, queues, now_ms, reason)

    def _route_copy(
        self, copy: Message, address: Address, queues: list[Queue], now_ms: int, reason: str
    ) -> None:
        """Route a moved copy. A copy paged to a durable queue is written as a move's
        (`PageStores.moving`): its original leaves in the journal append of this step, and
        a restart passes the copy if that append was lost (issue 23, store/paging.py)."""
        stores = self.page_stores
        if stores is None:
            self._deliver_to(copy, address, queues, now_ms, reason=reason)
            return
        moving, stores.moving = stores.moving, True
        try:
            self._deliver_to(copy, address, queues, now_ms, reason=reason)
        finally:
            stores.moving = moving

    def hop(self, queue: Queue, message: Message, **extra: Any) -> MoveAnnotations:
        """The B-090 annotations of a move out of `queue`: where it came from, and the
        original routing type carried forward when it was moved before."""
        internal = message.get_annotations().get(ORIG_ROUTING_TYPE)
        # Only a routing type's byte is carried: a producer may have written any integer
        # there (a ulong of 2**64-1 failed the copy's encoding as a byte, and the whole
        # move or retry with it: sixth attack pass).
        known = int(internal) if isinstance(internal, int) else None
        return MoveAnnotations(
            orig_address=queue.address,
            orig_queue=queue.name,
            orig_message_id=message.msg_id,
            orig_routing_type=self._orig_routing_type(message),
            routing_type=known if known in ROUTING_TYPE_OF_BYTE else None,
            **extra,
        )

    @staticmethod
    def _orig_routing_type(message: Message) -> int | None:
        """B-090: only when the original carried a routing-type annotation."""
        routing_type = annotated_routing_type(message.get_annotations())
        return None if routing_type is None else BYTE_OF_ROUTING_TYPE[routing_type]

    @within_call  # from settle and dispatch (dead letters, expiry): auto-creates
    def _ensure_move_resources(self, target: str, origin: str, prefix: str, suffix: str) -> None:
        with self._acting_for(None, None):  # broker-internal: not the client's permission
            self._create_move_resources(target, origin, prefix, suffix)

    def _create_move_resources(self, target: str, origin: str, prefix: str, suffix: str) -> None:
        """B-074/B-086: the target address and a `<prefix><origin><suffix>` queue."""
        target_settings = self.settings.resolve(target)
        routing_type = target_settings.default_queue_routing_type
        self.create_address(target, {routing_type}, auto_created=True)
        name = f"{prefix}{origin}{suffix}"
        if name not in self.queues:
            quoted = origin.replace("'", "''")
            self._auto_queue(
                name,
                target,
                routing_type,
                target_settings,
                filter=f"_AMQ_ORIG_ADDRESS = '{quoted}'",
            )

    def _move_to_dla(
        self,
        message: Message,
        origin: str,
        settings: ResolvedSettings,
        move: MoveAnnotations,
        *,
        queue: Queue | None = None,
        ref: Ref | None = None,
    ) -> Message | None:
        """Route a copy to the DLA (B-073); None when it has no queue (dropped, B-072)."""
        dla = settings.dead_letter_address
        address = self.post_office.addresses.get(dla)
        copy = self.copier.copy(message, move)
        copy.msg_id = next(self._msg_ids)
        copy.first_ts = message.first_ts
        copy.address = dla
        self._set_expiration(copy, dla, self.now_ms)
        routing_type = ROUTING_TYPE_OF_BYTE.get(move.routing_type)
        queues = self.post_office.route(copy, address, routing_type) if address else []
        if not queues:
            self.stats.killed_no_dla += 1
            log.warning(
                "dropping message %s from %s: dead-letter-address %s has no queue (B-072)",
                message.msg_id,
                origin,
                dla,
            )
            return None
        assert address is not None
        if queue is not None and ref is not None and self.emitter.failures:
            queue.event(
                "dead-lettered",
                ref,
                reason=move.dlq_reason,
                target_address=dla,
                target_queues=tuple(q.name for q in queues),
                copy_msg_id=copy.msg_id,
                error_condition=move.dlq_error_condition,
                error_description=move.dlq_error_description,
            )
        self._route_copy(copy, address, queues, self.now_ms, "move")
        return copy

    def track_expiry(self, queue: Queue, ref: Ref) -> None:
        heapq.heappush(
            self._expiries, (ref.message.expiration_ms, next(self._expiry_seq), queue, ref)
        )

    @entry
    def expire_due(self, now_ms: int) -> int:
        """The periodic scan (B-084): expire every waiting reference whose time is up
        (`now_ms`: the call's time, `tick`'s).

        Pops only due entries of the expiry index: O(expired x log n), not O(messages).
        References being delivered are skipped; they are indexed again if they return.
        """
        expired = 0
        index = self._expiries
        while index and index[0][0] <= now_ms:
            _, _, queue, ref = heapq.heappop(index)
            if queue.name in self.queues and queue.expire(ref):
                expired += 1
        for queue in list(self.queues.values()):  # B-151: paged ones, as they are read
            pages = queue.pages
            if pages is not None and 0 < pages.expiring_ms <= now_ms:
                expired += queue.expire_paged(now_ms, self._effects)
        if expired:
            for queue in list(self.queues.values()):
                if queue.consumers:
                    queue.dispatch(self._effects)
        return expired

    def expired(self, queue: Queue, ref: Ref) -> None:
        """B-085: move a copy to the expiry address (with x-opt-ACTUAL-EXPIRY), or drop."""
        message = ref.message
        now_ms = self.now_ms
        settings = self.settings.resolve(message.address or queue.address)
        target = settings.expiry_address
        if target and settings.auto_create_expiry_resources and message.address != target:
            self._ensure_move_resources(
                target,
                message.address or queue.address,
                settings.expiry_queue_prefix,
                settings.expiry_queue_suffix,
            )
        address = self.post_office.addresses.get(target) if target else None
        if address is not None:
            move = self.hop(queue, message, actual_expiry=now_ms)
            copy = self.copy_for_move(message, move)
            copy.address = target
            self._set_expiration(copy, target, now_ms)
            routing_type = ROUTING_TYPE_OF_BYTE.get(move.routing_type)
            queues = self.post_office.route(copy, address, routing_type)
            if queues:
                if self.emitter.failures:
                    queue.event(
                        "expired",
                        ref,
                        reason="moved",
                        target_address=target,
                        target_queues=tuple(q.name for q in queues),
                        copy_msg_id=copy.msg_id,
                    )
                self._route_copy(copy, address, queues, now_ms, "move")
                return
        if self.emitter.failures:
            queue.event("expired", ref, reason="dropped")
        if queue.name not in self._expiry_drop_warned:
            self._expiry_drop_warned.add(queue.name)
            log.warning(
                "dropping expired messages from queue %s: %s (warned once per queue)",
                queue.name,
                f"expiry-address {target} has no queue" if target else "no expiry-address is set",
            )
