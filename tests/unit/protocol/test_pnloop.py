"""The hot path's fused engine calls (`protocol/pnloop.py`, `_pnloop.c`, issue 20): the
event loop and the transfers give the peer the same frames with them as with proton's
binding one call at a time (B-023, B-041, B-044, B-050, B-152)."""

from __future__ import annotations

from random import Random

import pytest
from proton import Connection, Delivery, Message
from support import frames as F
from support import pnloop as support
from unit.protocol.test_handler import Client

from amqpbroker.amqp.sections import UInt, scan, with_delivery_count
from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.core.effects import Dispatch
from amqpbroker.protocol import AmqpConnection, Shell, moves, pnloop
from amqpbroker.protocol.shell import ConsumerLink, delivery_id_of

MODES = support.modes()


@pytest.fixture(params=MODES)
def shell(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Shell:
    support.use(request.param, monkeypatch)
    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    return Shell(broker)


def test_the_fused_module_binds_every_function() -> None:
    """`_pnloop.c` takes proton's functions in `pnloop.FUNCTIONS`' order, all of them."""
    module = support.fused_module()
    assert pnloop.bind(module)
    assert module.bind((1,)) == -1  # wrong count
    assert module.bind((0,) * len(pnloop.FUNCTIONS)) == -1  # a NULL
    assert pnloop.bind(module)


def test_the_fused_calls_refuse_a_null_or_a_non_int_pointer() -> None:
    """Issue 20: `_pnloop` takes proton's pointers as ints; 0 or another type raises
    instead of reaching proton (a crash), and a wrong arity is a TypeError."""
    module = support.fused_module()
    assert pnloop.bind(module)
    with pytest.raises(ValueError, match="NULL"):
        module.settle(0)
    with pytest.raises(TypeError):
        module.settle("not a pointer")
    with pytest.raises(TypeError):
        module.accept()
    with pytest.raises(ValueError, match="NULL"):
        module.next(0, 0)


def test_send_receive_accept_in_order(shell: Shell) -> None:
    """B-023/B-041: each send accepted, each message delivered once in order, each accept
    acks it: the fused loop reads and pops every event exactly once."""
    client = Client(shell)
    client.receiver("q", "queue", credit=100)
    sender = client.sender("q", "queue")
    for i in range(20):
        client.send(sender, Message(body=f"m{i}"))
    assert client.outcomes == [Delivery.ACCEPTED] * 20
    assert [m.body for m, _ in client.received] == [f"m{i}" for i in range(20)]
    for i in range(20):
        client.settle(i, Delivery.ACCEPTED)
    assert shell.broker.queues["q"].message_count == 0


def test_a_large_message_arrives_in_frames_and_whole(shell: Shell) -> None:
    """Partial deliveries wait for their last frame; a message larger than the loop's
    reused buffer (64 KiB) is read whole."""
    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    body = bytes(range(256)) * 1200  # 300 KiB: several frames
    client.send(sender, Message(body=body))
    assert client.outcomes == [Delivery.ACCEPTED]
    [(message, _)] = client.received
    assert bytes(message.body) == body


def test_modified_then_accepted(shell: Shell) -> None:
    """B-044/B-050: a modified{delivery-failed} return is redelivered with its count."""
    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    client.send(sender, Message(body=b"x"))
    client.settle(0, Delivery.MODIFIED, failed=True)
    assert client.received[1][0].delivery_count == 1
    client.settle(1, Delivery.ACCEPTED)
    assert shell.broker.queues["q"].message_count == 0


@pytest.mark.parametrize(
    "message",
    [
        Message(body=b"x" * 1024),  # an empty header (00 53 70 45): the bench's
        Message(body="y", durable=True, priority=7, ttl=5.0),
        Message(body="z", first_acquirer=True),
        Message(body="w", delivery_count=3),  # a producer's count: rewritten to 0 first
    ],
    ids=["empty-header", "fields", "first-acquirer", "producer-count"],
)
def test_a_redelivery_sends_the_stored_bytes_with_only_its_header_rewritten(
    shell: Shell, message: Message
) -> None:
    """B-050 (issue 20): the new header goes out ahead of the stored bytes after the old
    one (`pnloop.send_headed`, not joined first): the peer receives exactly
    `with_delivery_count` of what the producer sent, on the first delivery (count 0)
    and on each redelivery (1, 2), fused or not."""
    client = Client(shell)
    client.receiver("q", "queue")
    client.send(client.sender("q", "queue"), message)
    sent = scan(bytes(message.encode()))
    for count in (1, 2):
        client.settle(count - 1, Delivery.MODIFIED, failed=True)
    assert client.raw == [
        with_delivery_count(sent.data, sent.header_end, count) for count in (0, 1, 2)
    ]
    assert [m.delivery_count for m, _ in client.received] == [0, 1, 2]
    client.settle(2, Delivery.ACCEPTED)
    assert shell.broker.queues["q"].message_count == 0


def test_a_headed_send_refuses_what_is_not_bytes_or_an_offset_out_of_range() -> None:
    """`_pnloop.send_headed` reads its two buffers as bytes, the second from `offset` on:
    anything else raises before proton is called."""
    module = support.fused_module()
    assert pnloop.bind(module)
    link = pnloop._key_of_address(Connection().session().sender("q")._impl)
    with pytest.raises(TypeError, match="bytes"):
        module.send_headed(link, 1, bytearray(b"h"), b"data", 0, False)
    for offset in (-1, 5):
        with pytest.raises(ValueError, match="offset"):
            module.send_headed(link, 1, b"h", b"data", offset, False)
    with pytest.raises(TypeError):
        module.send_headed(link, 1, b"h", b"data", 0)  # arity


@pytest.mark.parametrize("failed", [False, True])
@pytest.mark.parametrize("undeliverable", [False, True])
def test_a_modified_outcomes_flags_are_read_with_its_event(
    shell: Shell, failed: bool, undeliverable: bool
) -> None:
    """B-043/B-044/B-045 (issue 20): the fused loop reads a modified outcome's two flags in
    the event's C call; each combination acts as read one call at a time: delivery-failed
    raises the wire count, undeliverable-here keeps the message from this link only."""
    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    client.send(sender, Message(body=b"x"))
    client.settle(0, Delivery.MODIFIED, failed=failed, undeliverable=undeliverable)
    if undeliverable:
        assert len(client.received) == 1  # not offered to this link again (B-045)
        client.receiver("q", "queue", name="other")  # another link gets it
    assert len(client.received) == 2
    assert client.received[1][0].delivery_count == (1 if failed else 0)
    client.settle(1, Delivery.ACCEPTED)
    assert shell.broker.queues["q"].message_count == 0


@pytest.mark.parametrize("code", [0xFF, 0x1234])
def test_an_unknown_outcome_beyond_the_packed_states_leaves_the_message_acquired(
    shell: Shell, code: int
) -> None:
    """B-048 (issue 20): the fused loop packs a delivery's remote state into its result up
    to 254; a larger (unknown) outcome's code comes through its out-array, and acts as
    one by one: no outcome, so the message stays acquired by that consumer."""
    peer = F.RawPeer(AmqpConnection(shell, peer="memory"))
    peer.opened()
    source = F.source("q", "queue")
    consumer = F.attach("c", role_receiver=True, source=source, target=F.NULL, properties=F.NULL)
    peer.send(F.frame(consumer), F.frame(F.flow(credit=5)))
    client = Client(shell)
    client.send(client.sender("q", "queue"), Message(body="m"))
    assert [F.performative_code(p) for p in peer.send()].count(F.TRANSFER) == 1
    unknown = b"\x00\x80" + code.to_bytes(8, "big") + b"\x45"  # described by a ulong
    peer.send(F.frame(F.disposition(first=0, state=unknown)))
    queue = shell.broker.queues["q"]
    assert peer.errors() == []
    assert (queue.message_count, queue.delivering) == (1, 1)


@pytest.mark.parametrize("tag", [b"x", b"0"])
def test_a_transfer_on_a_link_the_broker_sends_on_ends_the_connection(
    shell: Shell, tag: bytes
) -> None:
    """Issue 15: the peer's own delivery on a consumer link closes the connection with
    amqp:invalid-field, fused or not."""
    peer = F.RawPeer(AmqpConnection(shell, peer="memory"))
    peer.opened()
    source = F.source("q", "queue")
    consumer = F.attach("c", role_receiver=True, source=source, target=F.NULL, properties=F.NULL)
    peer.send(F.frame(consumer), F.frame(F.flow(credit=5)))
    peer.send(F.frame(F.transfer(tag=tag, state=F.outcome(F.ACCEPTED)), payload=F.message()))
    assert peer.errors() == [
        (F.CLOSE, ("amqp:invalid-field", "transfer: a transfer on a link the broker sends on"))
    ]
    assert peer.connection.finished


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "delivery_id", [0, 1, 9, 10, 10**9, 2**62 - 1, 2**62, 2**64 - 1, 10**20 - 1]
)
def test_a_sent_delivery_is_tagged_with_its_id(
    mode: str, delivery_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused send writes the tag in C (up to 2**62 - 1; larger ids take the calls one
    by one): `delivery_id_of` reads back the id either way."""
    from amqpbroker.core import ConsumerId, DeliveryId
    from amqpbroker.core import Message as CoreMessage

    support.use(mode, monkeypatch)
    sender = Connection().session().sender("q")
    link: ConsumerLink[object] = ConsumerLink(ConsumerId(1), sender, None)  # type: ignore[type-var]
    link.send(
        Dispatch(ConsumerId(1), DeliveryId(delivery_id), CoreMessage(b"\x00Sw\xa1\x01x"), 0, False)
    )
    [delivery] = link.unsettled  # its key: an int (its address) when fused
    assert type(delivery) is int if mode == "fused" else type(delivery) is not int
    assert Delivery.wrap(pnloop.pointer(delivery)).tag == str(delivery_id)
    assert delivery_id_of(delivery) == delivery_id


def test_consumer_credit_and_drain(shell: Shell) -> None:
    """B-037: a consumer's flow (credit, drain) reaches the core from the fused loop's
    read of the link as from proton's binding."""
    client = Client(shell)
    sender = client.sender("q", "queue")
    for i in range(5):
        client.send(sender, Message(body=f"m{i}"))
    receiver = client.receiver("q", "queue", credit=3)
    assert len(client.received) == 3
    receiver.flow(1)
    client.pump()
    assert len(client.received) == 4
    receiver.drain(10)
    client.pump()
    assert len(client.received) == 5
    assert receiver.credit == 0  # the drain was answered


@pytest.mark.parametrize("fail", [False, True])
def test_a_durable_send_is_settled_once_stored(shell: Shell, fail: bool) -> None:
    """B-023 with the journal's sync: a durable send is accepted once its records are
    stored (`accept_stored`: accept, settle and let go of the delivery in one call), or
    rejected with resource-limit-exceeded when the journal failed."""
    from amqpbroker.core.persistence import Persistence
    from amqpbroker.store.memory import MemoryJournal

    journal = MemoryJournal()
    shell.broker.enable_persistence(Persistence(journal))
    client = Client(shell)
    client.receiver("q", "queue")
    sender = client.sender("q", "queue")
    if fail:
        journal.fail(OSError(28, "No space left on device"))
    for i in range(3):
        client.send(sender, Message(body=f"m{i}", durable=True))
    if fail:
        assert client.outcomes == [Delivery.REJECTED] * 3
    else:
        assert client.outcomes == [Delivery.ACCEPTED] * 3
        assert [m.body for m, _ in client.received] == ["m0", "m1", "m2"]


def test_a_producers_settle_of_a_durable_send_is_not_read_as_a_transfer(shell: Shell) -> None:
    """Fifth attack pass (B-021, B-152), fused and one by one: the peer settles durable
    send A before the journal answered, while the first frame of B has come. Proton's
    delivery event for that disposition was read as A's transfer: `recv` read the link's
    current delivery (B, partial), so zero bytes were queued as a message and B was
    dropped, settled without an outcome. Now A and B are queued whole, B accepted."""
    from amqpbroker.core.persistence import Persistence
    from amqpbroker.store.memory import MemoryJournal

    shell.broker.enable_persistence(Persistence(MemoryJournal()))
    peer = F.RawPeer(AmqpConnection(shell, peer="memory"))
    peer.opened()
    peer.send(F.frame(F.attach("p", role_receiver=False, target=F.target("q", "queue"))))
    durable = b"\x00\x53\x70\xc0\x02\x01\x41"
    first, second = F.message("A", header=durable), F.message("B" * 100, header=durable)
    settle_first = F.Node(F.DISPOSITION, [F.enc(False), F.enc(UInt(0)), F.NULL, F.enc(True)])
    answered = peer.send(
        F.frame(F.transfer(delivery_id=0, tag=b"a"), payload=first),
        F.frame(F.transfer(delivery_id=1, tag=b"b", more=True), payload=second[:20]),
        F.frame(settle_first),
    )
    answered += peer.send(F.frame(F.transfer(delivery_id=None, tag=None), payload=second[20:]))
    assert [bytes(ref.message.data) for ref in shell.broker.queues["q"].refs()] == [first, second]
    [of_b] = [p for p in answered if F.performative_code(p) == F.DISPOSITION and p.value[1] == 1]
    assert len(of_b.value) > 4
    assert F.performative_code(of_b.value[4]) == F.ACCEPTED, of_b


def test_an_empty_transfer_is_settled_and_queues_nothing(shell: Shell) -> None:
    """The check of the test above leaves the link's current delivery alone: a transfer
    with no payload (nothing pending, yet current) is read as before, fused and one by
    one: settled, no message queued, the connection kept."""
    peer = F.RawPeer(AmqpConnection(shell, peer="memory"))
    peer.opened()
    peer.send(F.frame(F.attach("p", role_receiver=False, target=F.target("q", "queue"))))
    answered = peer.send(F.frame(F.transfer(delivery_id=0, tag=b"e")))
    answered += peer.send(F.frame(F.transfer(delivery_id=1, tag=b"m"), payload=F.message("m")))
    settled = [int(p.value[1]) for p in answered if F.performative_code(p) == F.DISPOSITION]
    assert settled == [0, 1], answered
    assert [bytes(ref.message.data) for ref in shell.broker.queues["q"].refs()] == [F.message("m")]
    assert peer.errors() == []
