"""Links: attach, credit and detach of producers, consumers and coordinators (issue 18).

Theory of operation
-------------------
A peer's attach (`PN_LINK_REMOTE_OPEN`) is counted against its session (at most
`MAX_LINKS_PER_SESSION`, issue 15), its name and termini are read and checked
(`peer.py`, `links.py`: never `Terminus.copy`), and it becomes a request to the core: a
receiving link (the peer sends) is a producer (`Broker.attach_producer`, B-022), or a
transaction coordinator when its target says so (B-140); a sending link is a consumer
(`Broker.attach_consumer`, B-024…B-036). The broker's answer is echoed in our source and
target (`answer_terminus`, the filters it applied, B-029 for a recovered subscription),
settle modes (`second` is answered with `first`, B-021), max-message-size on producers
(B-152); a producer gets `PRODUCER_CREDIT`, a consumer's credit goes to the core
(`Broker.set_credit`). A `BrokerError` refuses the attach with its condition (an attach
answered and closed at once). Flow on a consumer link is credit and drain for the core;
on a producer link it is informational (both in `transfers.py`, the hot path). Detach and
close return the link's deliveries (`Broker.detach_consumer`, B-053) and free the link
once ended on both sides.

The connection keeps its own maps keyed by the `pn_link_t` (`producers`, `consumers`,
`coordinators`); nothing is stored on proton objects. `_Attach` is a part of
`AmqpConnection` (a mixin): it declares the connection state it uses, which
`AmqpConnection.__init__` sets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi, lib
from proton import Condition, Endpoint, Event, Link, Terminus

import amqpbroker.protocol.pnloop as pnloop
from amqpbroker.core import Broker, BrokerError, ConnectionId, Window
from amqpbroker.protocol.links import (
    TerminusFields,
    answer_terminus,
    consumer_request,
    echo_source_filter,
    producer_request,
    read_terminus,
    recovered_source,
)
from amqpbroker.protocol.peer import MAX_VALUE_NODES, count_nodes, name_for_log, read_link_name
from amqpbroker.protocol.shell import ConsumerLink, ProducerLink, Shell
from amqpbroker.protocol.transfers import PRODUCER_CREDIT, Transfers

log = logging.getLogger("amqpbroker.protocol.handler")  # kept from before the split (issue 18)

MAX_LINKS_PER_SESSION = 256  # a 257th attach on a session closes the connection (issue 15)
# What the open links of one connection may hold of the peer's attach fields (names,
# addresses, filters, capabilities, properties): 64 sessions x 256 links x a 128 KiB
# frame would be 2 GiB kept for one socket (issue 15 attack: 8 x 256 links with 100 KB
# names grew the broker by 311 MB). 16 MiB is 16,000 links of 1 KiB each.
MAX_ATTACH_BYTES = 16 * 1024 * 1024
# What Proton keeps per decoded value (node) besides its encoded bytes: measured ~80 bytes
# (65,000 nulls, 10 bytes on the wire, grew the process by 5 MB; issue 15 attack).
NODE_BYTES = 80


def attach_bytes(impl: Any) -> int | None:
    """What the peer's attach of `impl` (a `pn_link_t`) makes the broker keep: its name,
    and its termini and properties, encoded and as Proton's decoded nodes (proton keeps
    them while the link lives, refused or not). None: its fields hold more than
    `MAX_VALUE_NODES` values together, which only closing the connection frees (B-153):
    the bytes alone did not bound them (an array of 65,000 nulls is 10 bytes)."""
    name = lib.pn_link_name(impl)
    size = len(ffi.string(name)) if name else 0
    datas = [lib.pn_link_remote_properties(impl)]
    for terminus in (lib.pn_link_remote_source(impl), lib.pn_link_remote_target(impl)):
        address = lib.pn_terminus_get_address(terminus)
        size += len(ffi.string(address)) if address else 0
        datas += (
            lib.pn_terminus_capabilities(terminus),
            lib.pn_terminus_outcomes(terminus),
            lib.pn_terminus_filter(terminus),
            lib.pn_terminus_properties(terminus),
        )
    nodes = 0
    for data in datas:
        nodes += count_nodes(data, MAX_VALUE_NODES - nodes)
        if nodes > MAX_VALUE_NODES:
            return None
    encoded: int = sum(max(0, lib.pn_data_encoded_size(d)) for d in datas if d)
    return size + encoded + nodes * NODE_BYTES


class _Attach:
    """`AmqpConnection`'s links (a mixin: it declares the connection state it uses, which
    `AmqpConnection.__init__` sets)."""

    _links_per_session: dict[Any, int]  # pn_session_t -> links not yet ended
    _attach_bytes: dict[Any, int]  # pn_link_t -> attach_bytes, of links not yet ended
    attach_bytes_total: int  # their sum (MAX_ATTACH_BYTES)
    anycast_prefix: str | None
    broker: Broker
    consumers: dict[Any, ConsumerLink[Any]]
    container_id: str
    coordinators: set[Any]
    id: ConnectionId
    max_message_size: int
    multicast_prefix: str | None
    peer: str
    producers: dict[Any, ProducerLink]
    shell: Shell[Any]
    transfers: Transfers
    user: str | None
    window: Window
    # the other parts' (connection.py, transfers.py)
    _fail: Callable[[str, str], None]
    resume_producers: Callable[[str | None], bool]
    close_with_error: Callable[[str, str], None]

    @property
    def roles(self) -> frozenset[str] | None:
        raise NotImplementedError  # AmqpConnection's

    def _on_link_open(self, event: Event) -> None:
        link: Link = event.link
        if link.state & Endpoint.LOCAL_ACTIVE:
            return
        session = lib.pn_link_session(link._impl)
        count = self._links_per_session.get(session, 0) + 1
        self._links_per_session[session] = count
        if count > MAX_LINKS_PER_SESSION:
            description = f"more than {MAX_LINKS_PER_SESSION} links on one session"
            log.warning("connection %s from %s: %s; closing it", self.id, self.peer, description)
            self._fail("amqp:resource-limit-exceeded", description)
            return
        cost = attach_bytes(link._impl)
        if cost is None:
            description = f"an attach whose fields hold more than {MAX_VALUE_NODES} values"
            log.warning("connection %s from %s: %s; closing it", self.id, self.peer, description)
            self._fail("amqp:resource-limit-exceeded", description)
            return
        self._attach_bytes[link._impl] = cost
        self.attach_bytes_total += cost
        if self.attach_bytes_total > MAX_ATTACH_BYTES:
            description = (
                f"the links of this connection hold more than {MAX_ATTACH_BYTES} bytes "
                "of names and termini"
            )
            log.warning("connection %s from %s: %s; closing it", self.id, self.peer, description)
            self._fail("amqp:resource-limit-exceeded", description)
            return
        try:
            read_link_name(link)
            if link.is_receiver:
                self._attach_producer(link)
            else:
                self._attach_consumer(link)
        except BrokerError as e:
            log.info(
                "refusing attach of link %r on connection %s (%s): %s %s",
                name_for_log(link),
                self.id,
                self.container_id or "-",
                e.condition,
                e,
            )
            self.close_link(link, e.condition, str(e))

    def _attach_producer(self, link: Link) -> None:
        # Issue 15: read and check the peer's termini first; answer with our own.
        source = read_terminus(link.remote_source, "source")
        remote_target = read_terminus(link.remote_target, "target")
        if remote_target.type == Terminus.COORDINATOR:
            self._attach_coordinator(link, source, remote_target)
            return
        target = self.broker.attach_producer(
            producer_request(
                remote_target,
                self.id,
                anycast_prefix=self.anycast_prefix,
                multicast_prefix=self.multicast_prefix,
                user=self.user,
                roles=self.roles,
            )
        )
        answer_terminus(link.source, source, address=source.address)
        answer_terminus(
            link.target,
            remote_target,
            address=target.address if remote_target.dynamic else remote_target.address,
        )
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST  # B-021: `second` is answered with `first`
        if self.max_message_size:
            link.max_message_size = self.max_message_size  # B-152: advertised
        link.open()
        self.producers[pnloop.key(link._impl)] = ProducerLink(link, target)
        # B-151 BLOCK: no credit to a link of a full address until it has room again
        # (`resume_producers`); every new link's 1000 let a client past the block by
        # attaching again (third attack pass).
        if self.broker.producer_may_send(target):
            link.flow(PRODUCER_CREDIT)

    def _attach_coordinator(
        self, link: Link, source: TerminusFields, target: TerminusFields
    ) -> None:
        """B-140: a transaction coordinator; declare/discharge arrive as transfers."""
        answer_terminus(link.source, source, address=source.address)
        answer_terminus(link.target, target, address=None)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self.coordinators.add(pnloop.key(link._impl))
        link.flow(PRODUCER_CREDIT)

    def _attach_consumer(self, link: Link) -> None:
        source = read_terminus(link.remote_source, "source")
        target = read_terminus(link.remote_target, "target")
        attached = self.broker.attach_consumer(
            consumer_request(
                link,
                source,
                self.id,
                self.container_id,
                anycast_prefix=self.anycast_prefix,
                multicast_prefix=self.multicast_prefix,
                user=self.user,
                roles=self.roles,
                window=self.window,
            )
        )
        answer_terminus(link.source, source, address=attached.address)
        if attached.recovered:
            link.source.address = attached.address
            recovered_source(link, attached.selector)
        else:
            echo_source_filter(link, source.filters, attached.selector, no_local=attached.no_local)
        answer_terminus(link.target, target, address=target.address)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        core = self.broker.hot.consumer_of.get(attached.consumer)
        consumer = ConsumerLink(attached.consumer, link, self, core)
        self.consumers[pnloop.key(link._impl)] = consumer
        self.shell.consumers[attached.consumer] = consumer
        if link.credit > 0:
            self.broker.set_credit(
                attached.consumer, consumer.credit(link.credit), drain=link.drain_mode
            )

    def close_link(self, link: Link, condition: str, description: str) -> None:
        """Refuse or end a link from the broker side, with an AMQP error (B-022, B-038)."""
        if not link.state & Endpoint.LOCAL_ACTIVE:
            link.open()
        link.condition = Condition(condition, description)
        link.close()
        impl = pnloop.key(link._impl)
        self.consumers.pop(impl, None)
        self.producers.pop(impl, None)
        self.coordinators.discard(impl)
        self.transfers.forget_incomplete(impl)

    def _drop_consumer(self, impl: Any, consumer: ConsumerLink[Any], *, closed: bool) -> None:
        del self.consumers[impl]
        self.shell.consumers.pop(consumer.id, None)
        self.broker.detach_consumer(consumer.id, closed=closed)

    def _on_link_detach(self, event: Event) -> None:
        self._link_ended(event.link, closed=False)

    def _on_link_close(self, event: Event) -> None:
        self._link_ended(event.link, closed=True)

    def _link_ended(self, link: Link, *, closed: bool) -> None:
        impl = pnloop.key(link._impl)
        consumer = self.consumers.get(impl)
        if consumer is not None:
            self._drop_consumer(impl, consumer, closed=closed)
        self.producers.pop(impl, None)
        self.coordinators.discard(impl)
        self.transfers.forget_incomplete(impl)
        if link.state & Endpoint.LOCAL_ACTIVE:
            if closed:
                link.close()
            else:
                link.detach()
        session = lib.pn_link_session(link._impl)
        count = self._links_per_session.get(session, 0)
        if count > 0:
            self._links_per_session[session] = count - 1
        self.attach_bytes_total -= self._attach_bytes.pop(link._impl, 0)
        link.free()  # issue 15: ended on both sides (see _on_session_close)
