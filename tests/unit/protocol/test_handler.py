"""The protocol adapter over two in-memory Proton engines: no sockets, no threads.

A client `proton.Transport` is pumped against `AmqpConnection` so the wire behaviour
(attach answers, outcomes, header rewrite, capabilities) is checked frame for frame.
"""

from __future__ import annotations

import struct
from random import Random
from typing import Any

import pytest
from proton import (
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Terminus,
    Transport,
)
from support import frames as F
from support.sasl_layer import PASS, plain_sasl

from amqpbroker.core import Broker, LifecycleEvent, ManualClock, SettingsRepository
from amqpbroker.protocol import AmqpConnection, Shell, connection, moves, pnloop
from amqpbroker.protocol.peer import read_symbols


class Client:
    """A client engine wired to one broker-side `AmqpConnection`."""

    def __init__(self, shell: Shell, container: str = "client") -> None:
        self.server = AmqpConnection(shell, peer="memory")
        self.transport = Transport()
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection.container = container
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self.received: list[tuple[Message, Any]] = []
        self.raw: list[bytes] = []  # the bytes of each message received, as they came
        self.outcomes: list[Any] = []
        self.pump()

    def pump(self) -> None:
        for _ in range(100):
            moved = False
            pending = self.transport.pending()
            if pending > 0:
                data = bytes(self.transport.peek(pending))
                self.transport.pop(pending)
                self.server.feed(data)
                moved = True
            for amqp in list(self.server.shell.dirty):
                self.server.shell.dirty.discard(amqp)
            out = self.server.output()
            while out:
                capacity = self.transport.capacity()
                self.transport.push(out[:capacity])
                out = out[capacity:]
                moved = True
                if out:
                    self._collect()
            if self.server in self.server.shell.dirty:  # e.g. its write window reopened
                moved = True
            if not moved:
                break
        self._collect()

    def _collect(self) -> None:
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                delivery = event.delivery
                link = delivery.link
                if link.is_receiver and delivery.readable and not delivery.partial:
                    message = Message()
                    raw = link.recv(delivery.pending)
                    self.raw.append(raw)
                    message.decode(raw)
                    link.advance()
                    self.received.append((message, delivery))
                elif link.is_sender and delivery.remote_state:
                    self.outcomes.append(delivery.remote_state)
                    delivery.settle()
            self.collector.pop()

    def sender(self, address: str | None, *caps: str) -> Link:
        link = self.session.sender(f"s-{address}-{len(caps)}")
        link.target.address = address
        _put_caps(link.target, caps)
        link.open()
        self.pump()
        return link

    def receiver(
        self,
        address: str | None,
        *caps: str,
        credit: int = 10,
        name: str | None = None,
        dynamic: bool = False,
    ) -> Link:
        link = self.session.receiver(name or f"r-{address}")
        if dynamic:
            link.source.dynamic = True
        else:
            link.source.address = address
        _put_caps(link.source, caps)
        link.open()
        link.flow(credit)
        self.pump()
        return link

    def send(self, link: Link, message: Message) -> None:
        link.delivery(b"%d" % len(self.outcomes))
        link.send(message.encode())
        link.advance()
        self.pump()

    def settle(self, index: int, state: Any, **fields: Any) -> None:
        delivery = self.received[index][1]
        for key, value in fields.items():
            setattr(delivery.local, key, value)
        delivery.update(state)
        delivery.settle()
        self.pump()


def _put_caps(terminus: Terminus, caps: tuple[str, ...]) -> None:
    if caps:
        terminus.capabilities.put_array(False, Data.SYMBOL)
        terminus.capabilities.enter()
        for cap in caps:
            terminus.capabilities.put_symbol(cap)
        terminus.capabilities.exit()


@pytest.fixture
def shell() -> Shell:
    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    return Shell(broker)


def test_send_receive_accept(shell: Shell) -> None:
    """B-023/B-041: the producer gets `accepted`; the consumer gets the bytes; accept acks."""
    client = Client(shell)
    receiver = client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    client.send(sender, Message(body="hi", durable=True, properties={"k": 1}))
    assert client.outcomes == [Delivery.ACCEPTED]
    [(message, _)] = client.received
    assert (message.body, message.durable, message.properties) == ("hi", True, {"k": 1})
    client.settle(0, Delivery.ACCEPTED)
    assert shell.broker.queues["q"].message_count == 0
    assert receiver.remote_condition is None


def test_connection_offers_artemis_capabilities(shell: Shell) -> None:
    """B-020: the broker's open offers ANONYMOUS-RELAY and friends."""
    client = Client(shell)
    offered = {str(c) for c in client.connection.remote_offered_capabilities}
    assert {
        "ANONYMOUS-RELAY",
        "DELAYED_DELIVERY",
        "SHARED-SUBS",
        "sole-connection-for-container",
    } <= offered


def test_modified_failed_redelivery_rewrites_only_the_header(shell: Shell) -> None:
    """B-044/B-050: the next delivery shows delivery-count 1, all else unchanged."""
    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    sent = Message(
        body=b"payload",
        subject="s",
        priority=6,
        ttl=60,
        properties={"a": "b"},
        annotations={"x-opt-z": 1},
    )
    client.send(sender, sent)
    client.settle(0, Delivery.MODIFIED, failed=True)
    again = client.received[1][0]
    assert again.delivery_count == 1
    assert (bytes(again.body), again.subject, again.priority, again.ttl) == (
        b"payload",
        "s",
        6,
        60.0,
    )
    assert again.properties == {"a": "b"}
    assert again.annotations == {"x-opt-z": 1}


def test_refused_attach_carries_the_condition(shell: Shell) -> None:
    """B-006: FQQN queue on another address -> detach with amqp:not-found."""
    client = Client(shell)
    client.sender("home", "queue")
    receiver = client.receiver("elsewhere::home")
    assert receiver.state & Endpoint.REMOTE_CLOSED
    assert receiver.remote_condition.name == "amqp:not-found"


def test_anonymous_relay_missing_to_is_rejected_failed(shell: Shell) -> None:
    """B-009: no `to` -> rejected with condition `failed`."""
    client = Client(shell)
    relay = client.sender(None)
    client.send(relay, Message(body="x"))
    assert client.outcomes == [Delivery.REJECTED]


def test_dynamic_receiver_gets_a_generated_address(shell: Shell) -> None:
    """B-030: the answered source address names the temporary queue."""
    client = Client(shell)
    receiver = client.receiver(None, dynamic=True)
    address = receiver.remote_source.address
    assert address in shell.broker.queues
    assert shell.broker.queues[address].config.temporary


def test_malformed_transfer_is_rejected_not_fatal(shell: Shell) -> None:
    """B-153: an undecodable message is rejected; the connection stays up."""
    client = Client(shell)
    sender = client.sender("q", "queue")
    sender.delivery(b"bad")
    sender.send(b"\x00\x53\x70\xc0\xff")  # a header list that runs past the end
    sender.advance()
    client.pump()
    assert client.outcomes == [Delivery.REJECTED]
    assert not client.connection.state & Endpoint.REMOTE_CLOSED


def test_closing_connection_returns_unsettled_uncounted(shell: Shell) -> None:
    """B-053: an AMQP close returns the message without counting the attempt."""
    leaver = Client(shell, container="leaver")
    leaver.receiver("q", "queue")
    producer = Client(shell, container="producer")
    producer.send(producer.sender("q", "queue"), Message(body="m"))
    leaver.pump()  # the dispatch went out on the leaver's connection
    assert len(leaver.received) == 1
    leaver.connection.close()
    leaver.pump()
    other = Client(shell, container="other")
    other.receiver("q", "queue")
    assert other.received[0][0].delivery_count == 0


def test_rejected_outcome_error_reaches_the_dead_letter_copy(shell: Shell) -> None:
    """B-046/B-079: the copy carries the rejection's condition and description."""
    from amqpbroker.core import AddressSettings

    shell.broker.settings.add(
        "#", AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)
    )
    client = Client(shell)
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="bad"))
    client.settle(0, Delivery.REJECTED, condition=Condition("app:invalid", "missing field"))
    dlq = client.receiver("DLA::DLQ.q", name="dlq")
    assert dlq.remote_condition is None
    copy = client.received[1][0]
    assert copy.annotations["x-opt-DLQ-ERROR-CONDITION"] == "app:invalid"
    assert copy.annotations["x-opt-DLQ-ERROR-DESCRIPTION"] == "missing field"
    assert copy.annotations["x-opt-DLQ-REASON"] == "rejected"
    assert copy.annotations["x-opt-ORIG-QUEUE"] == "q"
    assert copy.delivery_count == 0


def test_settled_without_outcome_keeps_the_message_acquired(shell: Shell) -> None:
    """B-048: no state -> no action; the message comes back only when the link ends."""
    client = Client(shell)
    receiver = client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="m"))
    client.received[0][1].settle()  # settle with no outcome
    client.pump()
    assert shell.broker.queues["q"].delivering == 1
    receiver.close()
    client.pump()
    assert shell.broker.queues["q"].ready_count == 1  # B-053: returned on link close


def test_a_disposition_finds_its_delivery_id_by_the_engine_handle(shell: Shell) -> None:
    """Issue 20: the consumer link keeps the id of each unsettled delivery it sent by its
    `pn_delivery_t` (no tag read back); settled out of order, each outcome reaches its own
    message (B-041, B-044), and every entry goes when the broker settles its delivery,
    with an outcome or without one (B-048), so that proton may reuse the handle."""
    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    for body in ("a", "b", "c"):
        client.send(sender, Message(body=body))
    [link] = shell.consumers.values()
    ids = [int(d.tag) for _, d in client.received]
    assert sorted(link.unsettled.values()) == ids
    client.settle(1, Delivery.MODIFIED, failed=True)  # "b" again, its count now 1
    assert [m.body for m, _ in client.received] == ["a", "b", "c", "b"]
    assert client.received[3][0].delivery_count == 1
    client.settle(0, Delivery.ACCEPTED)
    client.received[2][1].settle()  # "c": settled with no outcome, still acquired
    client.pump()
    assert list(link.unsettled.values()) == [int(client.received[3][1].tag)]
    client.settle(3, Delivery.ACCEPTED)
    assert link.unsettled == {}
    queue = shell.broker.queues["q"]
    assert (queue.message_count, queue.delivering) == (1, 1)  # "c", B-048


def test_modified_annotations_are_ignored(shell: Shell) -> None:
    """B-049: the message-annotations field of `modified` is not merged."""
    client = Client(shell)
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="m", annotations={"x-opt-a": 1}))
    delivery = client.received[0][1]
    delivery.local.failed = True
    delivery.local.annotations = {"x-opt-b": 2}
    delivery.update(Delivery.MODIFIED)
    delivery.settle()
    client.pump()
    assert client.received[1][0].annotations == {"x-opt-a": 1}


def test_producer_sent_delivery_count_is_zero_on_first_delivery(shell: Shell) -> None:
    """B-050: first delivery shows 0 even if the producer wrote a count; first-acquirer
    passes through on first delivery and becomes false on a redelivery."""
    client = Client(shell)
    client.receiver("q", "queue")
    sent = Message(body="m", delivery_count=7, first_acquirer=True)
    client.send(client.sender("q", "queue"), sent)
    first = client.received[0][0]
    assert first.delivery_count == 0
    assert first.first_acquirer is True
    client.settle(0, Delivery.MODIFIED, failed=True)
    again = client.received[1][0]
    assert again.delivery_count == 1
    assert again.first_acquirer is False


def test_message_without_header_gets_one_only_on_redelivery(shell: Shell) -> None:
    """B-050: first delivery forwards the bytes unchanged; a redelivery adds a header
    holding only delivery-count."""
    from amqpbroker.amqp import sections

    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    raw = sections.rebuild(bytes(Message(body="m").encode()), header=None)  # no header section
    sender.delivery(b"nh")
    sender.send(raw)
    sender.advance()
    client.pump()
    assert sections.scan(bytes(shell.broker.queues["q"].refs()[0].message.data)).header_end == 0
    client.settle(0, Delivery.MODIFIED, failed=True)
    again = client.received[1][0]
    assert (again.delivery_count, again.durable) == (1, False)


def test_dead_letter_annotations_have_exact_amqp_types(shell: Shell) -> None:
    """B-090/B-079: symbol keys; string, long, uint, symbol values as specified."""
    from proton import Data
    from support.annotations import annotation_types

    from amqpbroker.core import AddressSettings

    shell.broker.settings.add(
        "#", AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)
    )
    client = Client(shell)
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="bad"))
    client.settle(0, Delivery.REJECTED, condition=Condition("app:e", "why"))
    [ref] = shell.broker.queues["DLQ.q"].refs()
    types = {k: kind for k, (kind, _) in annotation_types(ref.message.data).items()}
    assert types == {
        "x-opt-ORIG-QUEUE": Data.STRING,
        "x-opt-ORIG-ADDRESS": Data.STRING,
        "x-opt-ORIG-MESSAGE-ID": Data.LONG,
        "x-opt-DLQ-REASON": Data.STRING,
        "x-opt-DLQ-ERROR-CONDITION": Data.SYMBOL,
        "x-opt-DLQ-ERROR-DESCRIPTION": Data.STRING,
        "x-opt-DLQ-DELIVERY-COUNT": Data.UINT,
    }


def test_dead_letter_copy_drops_ttl_and_absolute_expiry(shell: Shell) -> None:
    """B-076: header ttl and properties absolute-expiry-time removed; the rest kept."""
    from amqpbroker.core import AddressSettings

    shell.broker.settings.add(
        "#", AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)
    )
    client = Client(shell)
    client.receiver("q", "queue")
    sent = Message(
        body="x",
        ttl=600,
        expiry_time=4_000_000_000,
        durable=True,
        id="m-7",
        properties={"keep": "me"},
        instructions={"x-opt-da": 1},
    )
    client.send(client.sender("q", "queue"), sent)
    client.settle(0, Delivery.REJECTED)
    client.receiver("DLA::DLQ.q", name="dlq")
    copy = client.received[1][0]
    assert (copy.ttl, copy.expiry_time) == (0, 0)
    assert (copy.durable, copy.id, copy.properties) == (True, "m-7", {"keep": "me"})
    assert not copy.instructions  # B-017: delivery annotations never forwarded


def test_changed_expiration_is_written_as_absolute_expiry_time(shell: Shell) -> None:
    """B-083: an expiry override writes properties.absolute-expiry-time and drops ttl."""
    from amqpbroker.core import AddressSettings

    shell.broker.settings.add("#", AddressSettings.of(max_expiry_delay=60_000))
    client = Client(shell)
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="x", ttl=3600, durable=True))
    got = client.received[0][0]
    now_ms = shell.broker.clock.now_ms()
    assert got.ttl == 0
    assert got.durable is True
    assert round(got.expiry_time * 1000) == now_ms + 60_000


def test_sole_connection_for_container_refuses_a_second_connection(shell: Shell) -> None:
    """B-020: a second connection with the same container-id that desires
    sole-connection-for-container is refused with amqp:invalid-field."""
    from proton import symbol

    first = Client(shell, container="app-1")
    assert first.connection.state & Endpoint.REMOTE_ACTIVE
    second = Client.__new__(Client)
    second.server = AmqpConnection(shell, peer="memory")
    second.transport = Transport()
    second.connection = Connection()
    second.collector = Collector()
    second.connection.collect(second.collector)
    second.transport.bind(second.connection)
    second.transport.sasl().allowed_mechs("ANONYMOUS")
    second.connection.container = "app-1"
    second.connection.desired_capabilities = [symbol("sole-connection-for-container")]
    second.received, second.outcomes = [], []
    second.connection.open()
    second.pump()
    assert second.connection.remote_properties == {
        symbol("amqp:connection-establishment-failed"): True
    }
    assert second.connection.remote_condition.name == "amqp:invalid-field"
    assert second.connection.remote_condition.info == {
        symbol("invalid-field"): symbol("container-id")
    }
    assert not first.connection.state & Endpoint.REMOTE_CLOSED


def test_consumer_priority_property_and_no_local_echo(shell: Shell) -> None:
    """B-035: attach property `priority`; B-034: no-local echoed on subscriptions."""
    from proton import Described, symbol

    client = Client(shell)
    link = client.session.receiver("prio")
    link.source.address = "topic-x"
    _put_caps(link.source, ("topic",))
    link.properties = {symbol("priority"): 7}
    link.source.filter.put_object(
        {symbol("no-local"): Described(symbol("apache.org:no-local-filter:list"), [])}
    )
    link.open()
    link.flow(1)
    client.pump()
    [consumer] = shell.broker.queues[
        next(q for q in shell.broker.queues if shell.broker.queues[q].address == "topic-x")
    ].consumers
    assert consumer.priority == 7
    echoed = link.remote_source.filter
    echoed.rewind()
    echoed.next()
    assert symbol("no-local") in echoed.get_object()


@pytest.mark.parametrize(
    ("annotations", "scheduled"),
    [
        ({"x-opt-delivery-delay": 5000}, True),
        ({"x-opt-delivery-time": 1}, False),  # in the past: deliverable now
        ({"x-opt-delivery-time": 1, "x-opt-delivery-delay": 5000}, False),  # time wins
        ({"x-opt-delivery-time": "soon"}, False),  # not a number: ignored (B-153)
        ({}, False),
    ],
)
def test_scheduled_delivery_annotations(
    shell: Shell, annotations: dict[str, object], scheduled: bool
) -> None:
    """B-015: x-opt-delivery-time / x-opt-delivery-delay schedule a message."""
    from proton import symbol

    client = Client(shell)
    sender = client.sender("sched", "queue")
    client.send(
        sender, Message(body="x", annotations={symbol(k): v for k, v in annotations.items()})
    )
    assert client.outcomes == [Delivery.ACCEPTED]
    assert shell.broker.queues["sched"].scheduled_count == (1 if scheduled else 0)


def test_reject_as_modified_mode(shell: Shell) -> None:
    """B-047: with the acceptor option, `rejected` behaves like modified{df=true}:
    redelivered to the same link with count 1, not dead-lettered."""
    client = Client(shell)
    client.server.reject_as_modified = True
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="m"))
    client.settle(0, Delivery.REJECTED)
    assert client.received[1][0].delivery_count == 1
    assert shell.broker.queues["q"].counters.killed == 0


def test_duplicate_detection_on_the_wire(shell: Shell) -> None:
    """B-012: the second message with the same _AMQ_DUPL_ID is accepted, not routed."""
    client = Client(shell)
    sender = client.sender("dups", "queue")
    for body in ("first", "second"):
        client.send(sender, Message(body=body, properties={"_AMQ_DUPL_ID": "order-42"}))
    client.send(sender, Message(body="other", properties={"_AMQ_DUPL_ID": "order-43"}))
    assert client.outcomes == [Delivery.ACCEPTED] * 3
    assert shell.broker.queues["dups"].message_count == 2


def test_null_source_recovers_a_durable_subscription(shell: Shell) -> None:
    """B-029: attach with a null source finds `<container>.<link>` and answers with
    address = queue name, durable unsettled-state, expiry never, capability topic."""
    client = Client(shell, container="app")
    sub = client.session.receiver("audit")
    sub.source.address = "events"
    _put_caps(sub.source, ("topic",))
    sub.source.durability = Terminus.DELIVERIES
    sub.source.expiry_policy = Terminus.EXPIRE_NEVER
    sub.open()
    client.pump()
    sub.detach()
    client.pump()
    client.send(client.sender("events", "topic"), Message(body="while-away"))
    again = client.session.receiver("audit")
    again.source.type = Terminus.UNSPECIFIED  # a null source
    again.open()
    again.flow(10)
    client.pump()
    source = again.remote_source
    assert source.address == "app.audit"
    assert source.durability == Terminus.DELIVERIES
    assert source.expiry_policy == Terminus.EXPIRE_NEVER
    assert read_symbols(source.capabilities, "source.capabilities") == ("topic",)
    assert client.received[-1][0].body == "while-away"


def test_null_source_for_an_unknown_subscription_is_not_found(shell: Shell) -> None:
    """B-029: no such subscription -> amqp:not-found "Unknown subscription link"."""
    client = Client(shell, container="app")
    link = client.session.receiver("nothing-here")
    link.source.type = Terminus.UNSPECIFIED
    link.open()
    client.pump()
    assert link.remote_condition.name == "amqp:not-found"
    assert link.remote_condition.description == "Unknown subscription link"


class _TickingClock(ManualClock):
    """A clock that moves 1 ms every time it is read."""

    def now_ms(self) -> int:
        self.advance(1)
        return super().now_ms()


def _ticking_shell() -> tuple[Shell, list[LifecycleEvent]]:
    """A shell over a broker on a `_TickingClock`, and the events it hands on, readable."""
    broker = Broker(
        settings=SettingsRepository(), clock=_TickingClock(), rng=Random(0), copier=moves.COPIER
    )
    shell = Shell(broker)
    events: list[LifecycleEvent] = []
    shell.event_sink = lambda raw: events.extend(map(LifecycleEvent.of, raw))
    return shell, events


def test_the_events_of_one_call_share_one_clock_reading() -> None:
    """B-170 `ts`: the broker reads its clock once per call (`clock.entry`, issue 18), so
    a call's events cost no clock call each and carry one time, in order; a later call
    has a later time."""
    shell, raw = _ticking_shell()
    client = Client(shell)
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), Message(body="hi"))
    client.settle(0, Delivery.ACCEPTED)
    assert [e.event for e in raw] == ["sent", "enqueued", "dispatched", "acked"]
    sent, enqueued, dispatched, acked = raw
    assert sent.ts == enqueued.ts == dispatched.ts  # one call: the transfer's publish
    assert acked.ts > dispatched.ts  # the next: the disposition's settle


def test_a_delivery_delay_counts_from_the_publish_own_clock_reading() -> None:
    """B-015 x-opt-delivery-delay, issue 18 (one clock reading per call): the scheduled
    time is the publish call's time plus the delay, the time its `sent` event carries;
    the adapter reads no clock of its own for it."""
    from proton import symbol

    shell, raw = _ticking_shell()
    client = Client(shell)
    sender = client.sender("later", "queue")
    client.send(sender, Message(body="x", annotations={symbol("x-opt-delivery-delay"): 5000}))
    [sent] = [e for e in raw if e.event == "sent"]
    [ref] = shell.broker.queues["later"].refs()
    assert ref.message.deliver_at_ms == sent.ts + 5000


def test_messages_leave_no_reference_cycles_behind() -> None:
    """`server.tune_gc` relies on it: a message's whole path through the handler and the
    core (send, dispatch, every outcome, redelivery, lifecycle events) is freed by
    reference counting, so collecting rarely, and freezing the start-up heap, leaks
    nothing."""
    import gc

    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    shell = Shell(broker)
    shell.event_sink = lambda events: None
    client = Client(shell)
    client.receiver("q", "queue", credit=1000)
    sender = client.sender("q", "queue")
    outcomes = (Delivery.ACCEPTED, Delivery.RELEASED, Delivery.MODIFIED, Delivery.REJECTED)

    def one(i: int) -> None:
        client.send(sender, Message(body="hi", durable=True, id=f"m{i}"))
        client.settle(len(client.received) - 1, outcomes[i % len(outcomes)])

    for i in range(40):  # warm up: caches, first-time objects
        one(i)
    gc.collect()
    gc.disable()
    try:
        for i in range(40, 240):
            one(i)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert len(client.received) > 240  # released and modified ones came back


def _limited_sender(shell: Shell, limit: int) -> tuple[Client, Link]:
    client = Client(shell)
    client.server.max_message_size = limit  # the acceptor's max-message-size (B-152)
    return client, client.sender("q", "queue")


def test_max_message_size_is_advertised_on_producer_links(shell: Shell) -> None:
    """B-152: the configured limit is in the broker's attach; 0 (none) without one."""
    _, limited = _limited_sender(shell, 10_000)
    assert limited.remote_max_message_size == 10_000
    assert Client(shell).sender("q", "queue").remote_max_message_size == 0


def test_a_message_over_max_message_size_detaches_the_link(shell: Shell) -> None:
    """B-152 / issue 16 item 3: message-size-exceeded, the message discarded."""
    client, sender = _limited_sender(shell, 10_000)
    client.send(sender, Message(body=b"x" * 20_000))
    client.pump()
    assert sender.state & Endpoint.REMOTE_CLOSED
    assert sender.remote_condition.name == "amqp:link:message-size-exceeded"
    assert shell.broker.queues["q"].message_count == 0
    assert not client.connection.state & Endpoint.REMOTE_CLOSED


def test_max_message_size_is_checked_as_the_frames_arrive(shell: Shell) -> None:
    """B-152: the first frames over the limit detach the link; the rest of the message
    is never awaited, and the connection goes on."""
    client, sender = _limited_sender(shell, 10_000)
    sender.delivery(b"big")
    sender.send(Message(body=b"x" * 20_000).encode())  # partial: no advance()
    client.pump()
    assert sender.remote_condition.name == "amqp:link:message-size-exceeded"
    sender.send(b"\x00" * 50_000)  # what a client already had on the wire
    sender.advance()
    client.pump()
    other = client.sender("q2", "queue")
    client.send(other, Message(body=b"small"))
    client.pump()
    assert shell.broker.queues["q2"].message_count == 1
    assert shell.broker.queues["q"].message_count == 0


def test_a_producer_is_topped_up_below_the_low_mark_cycle_after_cycle(shell: Shell) -> None:
    """B-021 (issue 20: the broker keeps an upper bound of a producer's credit and asks
    the engine only near the low mark): credit goes back to 1000 each time it falls
    below 300, over two cycles, and a transfer bigger than the receive buffer (64 KiB)
    arrives whole among them."""
    client, sender = _limited_sender(shell, 0)
    assert sender.credit == 1000
    seen = []
    for i in range(1450):
        body = b"x" * 70_000 if i == 800 else b"m%d" % i
        client.send(sender, Message(body=body))
        seen.append(sender.credit)
        assert 300 <= sender.credit <= 1000
    assert seen.count(1000) == 2  # topped up at the 701st and the 1,402nd message
    queue = shell.broker.queues["q"]
    assert queue.message_count == 1450
    assert [r.message.size > 70_000 for r in queue.iter_refs()].count(True) == 1


def test_an_aborted_transfer_is_discarded_and_its_credit_restored(shell: Shell) -> None:
    """B-152: an aborted (partial) transfer is dropped; the producer's credit is back."""
    client, sender = _limited_sender(shell, 0)
    credit = sender.credit
    delivery = sender.delivery(b"aborted")
    sender.send(Message(body=b"part").encode()[:5])
    client.pump()
    delivery.abort()
    client.pump()
    assert sender.credit == credit
    client.send(sender, Message(body=b"whole"))
    client.pump()
    assert shell.broker.queues["q"].message_count == 1
    assert not sender.state & Endpoint.REMOTE_CLOSED


def test_a_receiver_never_gets_more_than_its_max_message_size(shell: Shell) -> None:
    """AMQP 1.0 2.7.3 / issue 16 item 3: a receiver that advertised 10,000 bytes got a
    20,000-byte message. It now gets only what fits; the rest waits in the queue."""
    client = Client(shell)
    sender = client.sender("q", "queue")
    client.send(sender, Message(body=b"x" * 20_000))
    client.send(sender, Message(body=b"y" * 100))
    link = client.session.receiver("limited")
    link.source.address = "q"
    _put_caps(link.source, ("queue",))
    link.max_message_size = 10_000
    link.open()
    link.flow(10)
    client.pump()
    assert [bytes(m.body) for m, _ in client.received] == [b"y" * 100]
    assert shell.broker.queues["q"].ready_count == 1


def test_security_disabled_is_explicit_and_no_roles_before_authentication(
    shell: Shell,
) -> None:
    """Issue 15 item 1, B-154: roles are None (everything allowed) only when the server
    gives no SASL layer; with one, a connection has no roles until authenticated, and the
    engine gets nothing (not even the pipelined open) until then."""
    from collections.abc import Callable

    from amqpbroker.amqp import sections
    from amqpbroker.protocol.sasl import SASL_HEADER, Credentials, Verdict

    assert AmqpConnection(shell, peer="memory").roles is None
    pending: list[Callable[[Verdict], None]] = []

    def verify(credentials: Credentials, done: Callable[[Verdict], None]) -> Callable[[], None]:
        pending.append(done)
        return lambda: None

    shell.roles_for = lambda user: frozenset({"app"}) if user == "u" else frozenset()
    secured = AmqpConnection(shell, peer="memory", sasl=plain_sasl(verify))
    assert secured.roles == frozenset()
    client = Transport()  # no SASL layer: AMQP header and open
    client_connection = Connection()
    client.bind(client_connection)
    client_connection.container = "pipelined"
    client_connection.open()
    amqp = bytes(client.peek(client.pending()))
    init = sections.encode_value(
        sections.Described(sections.ULong(0x41), [sections.Symbol("PLAIN"), b"\x00u\x00p"])
    )
    secured.feed(SASL_HEADER + struct.pack(">IBBH", 8 + len(init), 2, 1, 0) + init + amqp)
    assert secured.awaiting_authentication
    assert not secured.opened  # the engine saw nothing
    assert secured.container_id == ""
    pending.pop()("u")
    assert (secured.user, secured.roles) == ("u", frozenset({"app"}))
    assert secured.opened
    assert secured.container_id == "pipelined"


def _plain_secured(shell: Shell) -> AmqpConnection:
    """A connection with the broker's SASL layer (security on) whose checks pass at once."""
    return AmqpConnection(shell, peer="memory", sasl=plain_sasl(PASS))


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    "after",
    [
        # A second SASL layer: proton offered ANONYMOUS and let it in (issue 15 attack).
        b"AMQP\x03\x01\x00\x00",
        b"AMQP\x02\x01\x00\x00",  # TLS after SASL
        b"AMQP\x00\x02\x00\x00",  # another AMQP version
        b"GET / HTTP/1.1\r\n\r\n",
    ],
)
def test_after_the_sasl_outcome_only_the_amqp_header_is_taken(
    shell: Shell, after: bytes, split: bool
) -> None:
    """Issue 15 attack, AMQP 1.0 §5.3.2: after the broker's sasl-outcome the peer must send
    the AMQP header; anything else (a second SASL header included, also a byte at a time)
    closes the connection with amqp:connection:framing-error before the engine reads it."""
    from amqpbroker.protocol.sasl import SASL_HEADER

    secured = _plain_secured(shell)
    init = F.frame(F.sasl_init("PLAIN", b"\x00u\x00p"), kind=1)
    rest = after + F.frame(F.sasl_init("ANONYMOUS"), kind=1) + F.AMQP_HEADER
    rest += F.frame(F.open_("second"))
    pieces = [SASL_HEADER + init, *(bytes([b]) for b in rest)]
    if not split:
        pieces = [b"".join(pieces)]
    received = b""
    for piece in pieces:
        secured.feed(piece)
        received += secured.output()
    assert secured.user == "u"
    assert not secured.opened
    assert secured.finished
    after_outcome = received[received.index(b"AMQP\x00") :] if b"AMQP\x00" in received else b""
    assert F.close_condition(after_outcome) == "amqp:connection:framing-error", received
    assert SASL_HEADER not in received[len(SASL_HEADER) :]  # no second SASL exchange


def test_the_amqp_header_after_the_sasl_outcome_may_come_a_byte_at_a_time(shell: Shell) -> None:
    """Issue 15 attack: the header check waits for the whole header, then the engine opens."""
    from amqpbroker.protocol.sasl import SASL_HEADER

    secured = _plain_secured(shell)
    secured.feed(SASL_HEADER + F.frame(F.sasl_init("PLAIN", b"\x00u\x00p"), kind=1))
    for byte in F.AMQP_HEADER + F.frame(F.open_("slow")):
        secured.feed(bytes([byte]))
    assert secured.opened
    assert secured.container_id == "slow"


# -- issue 15: the write window of a consumer that does not read --------------------------


def _write_only(client: Client) -> None:
    """The client's frames reach the broker; the broker's output is left unread."""
    pending = client.transport.pending()
    if pending > 0:
        data = bytes(client.transport.peek(pending))
        client.transport.pop(pending)
        client.server.feed(data)


def _stalled_consumer(
    shell: Shell, monkeypatch: pytest.MonkeyPatch, *, settled: bool
) -> tuple[Client, Link]:
    """50 messages of 2 KB queued; a consumer grants 1000 credit and reads nothing."""
    monkeypatch.setattr(connection, "ENGINE_WINDOW_BYTES", 10_000)
    client = Client(shell)
    sender = client.sender("w", "queue")
    for i in range(50):
        client.send(sender, Message(body=b"%02d" % i + b"x" * 2000))
    receiver = client.session.receiver("r-w")
    receiver.source.address = "w"
    _put_caps(receiver.source, ("queue",))
    if settled:
        receiver.snd_settle_mode = Link.SND_SETTLED
    receiver.open()
    receiver.flow(1000)
    _write_only(client)
    return client, receiver


def _handed(shell: Shell, *, settled: bool) -> int:
    queue = shell.broker.queues["w"]
    return 50 - queue.message_count if settled else queue.delivering


@pytest.mark.parametrize("settled", [False, True])
def test_a_consumer_is_handed_a_window_of_bytes_then_the_rest_as_it_reads(
    shell: Shell, monkeypatch: pytest.MonkeyPatch, settled: bool
) -> None:
    """Issue 15, B-037: with 1000 credit and nothing read, the engine gets about its
    window (10,000 bytes here: 5 transfers of 2 KB), not the 50 messages; reading resumes
    the consumer with the credit it kept, until all 50 arrive in order."""
    client, _ = _stalled_consumer(shell, monkeypatch, settled=settled)
    assert _handed(shell, settled=settled) == 5
    client.server.feed(b"")  # more steps without reading: still nothing more
    assert _handed(shell, settled=settled) == 5
    client.pump()
    assert [bytes(m.body[:2]) for m, _ in client.received] == [b"%02d" % i for i in range(50)]
    assert _handed(shell, settled=settled) == 50


def test_a_drain_while_stalled_is_answered_after_what_was_ready(
    shell: Shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15, B-037: a drain that arrives while the window is spent is neither lost
    nor answered early: once the client reads, all 50 messages come, then drained
    (the client's credit is 0)."""
    client, receiver = _stalled_consumer(shell, monkeypatch, settled=False)
    receiver.drain(0)
    _write_only(client)
    assert _handed(shell, settled=False) == 5
    client.pump()
    assert [bytes(m.body[:2]) for m, _ in client.received] == [b"%02d" % i for i in range(50)]
    assert receiver.credit == 0
    assert shell.broker.queues["w"].delivering == 50
    client.send(client.sender("w", "queue"), Message(body=b"after the drain"))
    assert len(client.received) == 50  # no credit left: the drain was answered


@pytest.mark.parametrize("digits", range(1, 21))
def test_a_sent_delivery_carries_its_id_as_its_tag_at_every_length(digits: int) -> None:
    """Issue 20: `ConsumerLink.send` hands proton one prebuilt tag struct per length; a
    delivery id of every length (1 to 20 decimal digits, the most a delivery id has) is
    the tag proton sends and the one `delivery_id_of` reads back."""
    from amqpbroker.core import ConsumerId, DeliveryId
    from amqpbroker.core import Message as CoreMessage
    from amqpbroker.core.effects import Dispatch
    from amqpbroker.protocol.shell import ConsumerLink, delivery_id_of

    sender = Connection().session().sender("q")
    link: ConsumerLink[Any] = ConsumerLink(ConsumerId(1), sender, None)
    ids = [DeliveryId(10 ** (digits - 1)), DeliveryId(10**digits - 1)]
    for delivery in ids:
        link.send(Dispatch(ConsumerId(1), delivery, CoreMessage(b"\x00Sw\xa1\x01x"), 0, False))
    tags = sorted(Delivery.wrap(pnloop.pointer(d)).tag for d in link.unsettled)
    assert tags == sorted(str(i) for i in ids)
    assert sorted(link.unsettled.values()) == ids
    assert sorted(delivery_id_of(d) for d in link.unsettled) == ids
