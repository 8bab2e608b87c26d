"""Management operations on queues (B-161): browse, purge, move, retry, stats."""

from __future__ import annotations

import pytest
from support.core_harness import Harness

from amqpbroker.core import AddressSettings, Message, NotFound, Rejected
from amqpbroker.core.operations import browse, move, purge, queue_stats, retry

DLA = {"#": AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)}


def _dead_letters(h: Harness, address: str, *bodies: bytes) -> None:
    target = h.producer(address, "queue")
    for body in bodies:
        h.send(target, body, props={"kind": body.decode()})
    c = h.consumer(address, "queue")
    for d in h.take(c):
        h.settle(c, d, Rejected())
    h.broker.detach_consumer(c, closed=True)


def test_browse_pages_and_filters() -> None:
    """B-161 listMessages: in order, paged, with a selector; nothing is acquired."""
    h = Harness()
    target = h.producer("q", "queue")
    for i in range(5):
        h.send(target, b"%d" % i, props={"n": i})
    page = browse(h.broker, "q", limit=2, offset=1)
    assert [r.message.data for r in page] == [b"1", b"2"]
    assert [r.message.data for r in browse(h.broker, "q", selector="n >= 3")] == [b"3", b"4"]
    assert h.queue("q").message_count == 5


def test_purge_with_selector_counts_killed() -> None:
    """B-161 removeMessages(filter): deleted and counted as killed."""
    h = Harness()
    target = h.producer("q", "queue")
    for color in ("red", "blue", "red"):
        h.send(target, color.encode(), props={"color": color})
    assert purge(h.broker, "q", selector="color = 'red'") == 2
    assert [r.message.data for r in h.queue("q").refs()] == [b"blue"]
    assert h.queue("q").counters.killed == 2
    assert purge(h.broker, "q") == 1


def test_purge_leaves_messages_being_delivered() -> None:
    """A delivered, unsettled message belongs to its consumer until it settles."""
    h = Harness()
    h.send(h.producer("q", "queue"))
    h.consumer("q", "queue")
    assert purge(h.broker, "q") == 0
    assert h.queue("q").delivering == 1


def test_retry_returns_dead_letters_to_their_queue() -> None:
    """B-161 retryMessages: back to the original queue, count 0, DLQ reasons removed,
    ORIG annotations describing the latest hop (B-090)."""
    h = Harness(DLA)
    _dead_letters(h, "orders", b"a", b"b")
    assert h.queue("DLQ.orders").message_count == 2
    assert retry(h.broker, "DLQ.orders", selector="kind = 'a'").retried == 1
    [back] = h.queue("orders").refs()
    assert back.message.data == b"a"
    assert back.delivery_count == 0
    annotations = back.message.get_annotations()
    assert annotations["x-opt-ORIG-QUEUE"] == "DLQ.orders"
    assert not any(k.startswith("x-opt-DLQ-") for k in annotations)
    assert h.queue("DLQ.orders").message_count == 1


def test_retry_by_ids() -> None:
    """B-161 retryMessage(messageID): by broker message id."""
    h = Harness(DLA)
    _dead_letters(h, "orders", b"a", b"b")
    wanted = [r.message.msg_id for r in h.queue("DLQ.orders").refs()][1]
    assert retry(h.broker, "DLQ.orders", ids=[wanted]).retried == 1
    assert [r.message.data for r in h.queue("orders").refs()] == [b"b"]


def test_retry_checks_each_id_against_what_its_redrive_line_says() -> None:
    """Issue 16 item 2: an id may name another message than the one the redrive list
    was written for; it is skipped, with the field that differs, and unknown ids are
    reported as not found."""
    h = Harness(DLA)
    target = h.producer("orders", "queue")
    h.send(target, b"a", properties={"message-id": "o-1"})
    h.send(target, b"b", properties={"message-id": "o-2"})
    c = h.consumer("orders", "queue")
    for d in h.take(c):
        h.settle(c, d, Rejected())
    first, second = (r.message.msg_id for r in h.queue("DLQ.orders").refs())
    result = retry(
        h.broker,
        "DLQ.orders",
        ids=[first, second, 999_999],
        expect={
            first: {"queue": "DLQ.orders", "original_address": "orders", "amqp_message_id": "o-1"},
            second: {"original_address": "orders", "amqp_message_id": "o-7"},
        },
    )
    assert result.retried == 1
    assert result.skipped == ((second, "amqp_message_id is 'o-2', expected 'o-7'"),)
    assert result.not_found == (999_999,)
    assert [r.message.data for r in h.queue("DLQ.orders").refs()] == [b"b"]


def test_retry_reports_a_line_for_another_queue_and_null_fields_are_not_checked() -> None:
    h = Harness(DLA)
    _dead_letters(h, "orders", b"a")
    [ref] = h.queue("DLQ.orders").refs()
    msg_id = ref.message.msg_id
    wrong = retry(h.broker, "DLQ.orders", ids=[msg_id], expect={msg_id: {"queue": "DLQ.x"}})
    assert wrong.skipped == ((msg_id, "queue is 'DLQ.orders', expected 'DLQ.x'"),)
    unchecked = {msg_id: {"amqp_message_id": None, "original_queue": "orders"}}
    assert retry(h.broker, "DLQ.orders", ids=[msg_id], expect=unchecked).retried == 1


def test_retry_leaves_messages_whose_queue_is_gone() -> None:
    """B-161: messages whose original queue no longer exists are left in place."""
    h = Harness(DLA)
    _dead_letters(h, "orders", b"a")
    h.broker.delete_queue("orders")
    assert retry(h.broker, "DLQ.orders").retried == 0
    assert h.queue("DLQ.orders").message_count == 1
    [ref] = h.queue("DLQ.orders").refs()
    named = retry(h.broker, "DLQ.orders", ids=[ref.message.msg_id])
    assert named.skipped == ((ref.message.msg_id, "original queue orders does not exist"),)


def test_move_to_another_queue_with_annotations() -> None:
    """B-161 moveMessages: into the named queue, with the B-090 annotations."""
    h = Harness()
    h.send(h.producer("src", "queue"), b"m")
    h.producer("dst", "queue")
    assert move(h.broker, "src", to_queue="dst") == 1
    [ref] = h.queue("dst").refs()
    assert ref.message.get_annotations()["x-opt-ORIG-QUEUE"] == "src"
    assert h.queue("src").message_count == 0


def test_unknown_queue_is_not_found() -> None:
    h = Harness()
    with pytest.raises(NotFound):
        purge(h.broker, "ghost")


def test_queue_stats_snapshot() -> None:
    """The counters of GET /api/v1/queues (B-161 semantics)."""
    h = Harness(DLA)
    _dead_letters(h, "orders", b"a")
    rows = {r.name: r for r in queue_stats(h.broker)}
    assert (rows["orders"].added, rows["orders"].killed, rows["orders"].dead_lettered) == (1, 1, 1)
    assert rows["DLQ.orders"].messages == 1


# -- issue 19: the operations the AMQP management address adds (B-161, B-162) ------------


def test_pause_stops_dispatch_and_resume_restarts_it() -> None:
    """B-161 pause()/resume(): nothing is dispatched while paused; resume hands out
    what waited."""
    from amqpbroker.core.operations import pause

    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    pause(h.broker, "q", paused=True)
    h.send(target, b"a")
    assert h.take(c) == []
    assert h.queue("q").message_count == 1
    pause(h.broker, "q", paused=False)
    assert [d.message.data for d in h.take(c)] == [b"a"]


def test_a_paused_queue_still_answers_a_drain() -> None:
    """A consumer that drains a paused queue is told at once (credit 0), never left
    waiting."""
    from amqpbroker.core.operations import pause

    h = Harness()
    h.send(h.producer("q", "queue"), b"a")
    c = h.consumer("q", "queue", credit=0)
    pause(h.broker, "q", paused=True)
    h.broker.set_credit(c, 5, drain=True)
    h.take(c)
    assert c in h.drained


def test_dead_letter_now_counts_killed_with_reason_management() -> None:
    """B-161 sendMessagesToDeadLetterAddress: a copy in the DLQ, reason `management`."""
    from amqpbroker.core.operations import dead_letter

    h = Harness(DLA)
    target = h.producer("q", "queue")
    for color in ("red", "blue"):
        h.send(target, color.encode(), props={"color": color})
    assert dead_letter(h.broker, "q", selector="color = 'red'") == 1
    assert [r.message.data for r in h.queue("q").refs()] == [b"blue"]
    assert h.queue("DLQ.q").message_count == 1
    counters = h.queue("q").counters
    assert (counters.killed, counters.dead_lettered_by_reason["management"]) == (1, 1)


def test_expire_now_moves_to_the_expiry_address() -> None:
    """B-161 expireMessages: expired now (B-085), counted as expired."""
    from amqpbroker.core.operations import expire

    settings = AddressSettings.of(expiry_address="EXP", auto_create_expiry_resources=True)
    h = Harness({"#": settings})
    target = h.producer("q", "queue")
    h.send(target, b"a")
    h.send(target, b"b")
    first = h.queue("q").refs()[0].message.msg_id
    assert expire(h.broker, "q", ids=[first]) == 1
    assert h.queue("q").counters.expired == 1
    assert h.queue("EXP.q").message_count == 1


def test_count_delivering_counts_unsettled_deliveries() -> None:
    """B-161 countDeliveringMessages(filter)."""
    from amqpbroker.core.operations import count_delivering

    h = Harness()
    target = h.producer("q", "queue")
    for color in ("red", "blue", "red"):
        h.send(target, color.encode(), props={"color": color})
    h.consumer("q", "queue", credit=2)
    assert count_delivering(h.broker, "q") == 2
    assert count_delivering(h.broker, "q", selector="color = 'blue'") == 1


@pytest.mark.parametrize("auto_delete_created", [True, False])
def test_created_queue_auto_deletes_by_auto_delete_created_queues(
    auto_delete_created: bool,
) -> None:
    """B-113/B-162: a queue created by management auto-deletes when
    auto-delete-created-queues says so (decided at creation), after use and two scans."""
    from amqpbroker.core import QueueConfig, RoutingType
    from amqpbroker.core.operations import create_queue

    settings = AddressSettings.of(auto_delete_created_queues=auto_delete_created)
    h = Harness({"#": settings}, address_queue_scan_period_ms=1_000)
    config = QueueConfig(name="made", address="made", routing_type=RoutingType.ANYCAST)
    create_queue(h.broker, config, auto_create_address=True)
    c = h.consumer("made", "queue")
    h.broker.detach_consumer(c, closed=True)
    h.advance(1_000)
    h.advance(1_000)
    assert ("made" in h.broker.queues) is not auto_delete_created


def test_create_queue_needs_its_address_unless_asked_to_create_it() -> None:
    """B-162 createQueue: auto-create-address false (Artemis's default) -> not found."""
    from amqpbroker.core import QueueConfig, RoutingType
    from amqpbroker.core.operations import create_queue

    h = Harness()
    config = QueueConfig(name="x", address="x", routing_type=RoutingType.ANYCAST)
    with pytest.raises(NotFound, match="auto-create-address"):
        create_queue(h.broker, config)


def test_create_queue_refuses_a_temporary_address() -> None:
    """B-162 createQueue: a temporary address goes with its connection, every queue on it
    too (`connection_closed`), so a durable queue created there would lose its stored
    messages when that client closes (and keep them after a crash): refused."""
    from amqpbroker.core import ClientError, ConnectionId, QueueConfig
    from amqpbroker.core.operations import create_queue

    h = Harness()
    temporary = h.producer(None, dynamic=True, conn=ConnectionId(2)).address
    assert temporary is not None
    (routing_type,) = h.broker.post_office.addresses[temporary].routing_types
    config = QueueConfig(name="kept", address=temporary, routing_type=routing_type)
    with pytest.raises(ClientError, match="temporary"):
        create_queue(h.broker, config)
    assert "kept" not in h.broker.queues


def test_destroy_queue_and_delete_address_refuse_while_in_use() -> None:
    """B-162 destroyQueue(name) with consumers / deleteAddress(name) with queues: refused
    unless removeConsumers / force."""
    from amqpbroker.core import CloseConsumer, IllegalState
    from amqpbroker.core.operations import delete_address, destroy_queue

    h = Harness()
    h.consumer("q", "queue")
    with pytest.raises(IllegalState):
        destroy_queue(h.broker, "q")
    with pytest.raises(IllegalState):
        delete_address(h.broker, "q")
    delete_address(h.broker, "q", force=True)
    assert "q" not in h.broker.queues
    assert any(isinstance(e, CloseConsumer) for e in h.broker.take_effects())


def test_the_management_address_needs_manage_and_is_never_auto_created() -> None:
    """B-154: a producer attach to activemq.management needs `manage`; B-110: a consumer
    cannot auto-create it."""
    from support.core_harness import CONN

    from amqpbroker.core import NotAuthorized, ProducerRequest
    from amqpbroker.core.attach import ConsumerRequest
    from amqpbroker.core.security import SecurityRepository

    security = SecurityRepository({"#": {"manage": ("admin",), "send": ("app", "admin")}})
    h = Harness(security=security)
    app = ProducerRequest(connection=CONN, address="activemq.management", roles=frozenset({"app"}))
    with pytest.raises(NotAuthorized):
        h.broker.attach_producer(app)
    admin = ProducerRequest(
        connection=CONN, address="activemq.management", roles=frozenset({"admin"})
    )
    assert h.broker.attach_producer(admin).management
    with pytest.raises(NotFound):
        h.broker.attach_consumer(
            ConsumerRequest(
                connection=CONN, container_id="c", link_name="l", address="activemq.management"
            )
        )
    assert "activemq.management" not in h.broker.post_office.addresses


def test_change_priority_moves_messages_to_the_tail_of_the_new_level() -> None:
    """B-161 changeMessagesPriority: matching waiting messages take the new priority and
    queue behind what already waits at that level (Artemis addTail)."""
    from amqpbroker.core.operations import change_priority

    h = Harness()
    target = h.producer("q", "queue")
    h.send(target, b"low-1", priority=1)
    h.send(target, b"high", priority=7)
    h.send(target, b"low-2", priority=1)
    assert change_priority(h.broker, "q", selector="JMSPriority = 1", priority=7) == 2
    c = h.consumer("q", "queue")
    delivered = h.take(c)
    assert [d.message.data for d in delivered] == [b"high", b"low-1", b"low-2"]
    assert [d.message.priority for d in delivered] == [7, 7, 7]


def test_change_priority_refuses_a_priority_outside_0_to_9() -> None:
    from amqpbroker.core import ClientError
    from amqpbroker.core.operations import change_priority

    h = Harness()
    h.send(h.producer("q", "queue"))
    with pytest.raises(ClientError, match=r"0\.\.9"):
        change_priority(h.broker, "q", priority=10)


def test_move_with_reject_duplicates_drops_what_the_target_has_seen() -> None:
    """B-161 moveMessages(filter, queue, rejectDuplicates=true): a message whose
    _AMQ_DUPL_ID the target address has seen (B-012) leaves its queue without a copy
    being routed; the ids of the moved ones are remembered (a second one is dropped)."""
    h = Harness()
    h.broker.publish(Message(b"seen", annotations={}), h.producer("t", "queue"), duplicate_id="a")
    source = h.producer("q", "queue")
    for body, dup in ((b"a", "a"), (b"b", "b"), (b"b-again", "b"), (b"none", None)):
        h.send(source, body, props={} if dup is None else {"_AMQ_DUPL_ID": dup})
    assert move(h.broker, "q", to_queue="t", reject_duplicates=True) == 4
    assert h.queue("q").message_count == 0
    assert [r.message.data for r in h.queue("t").refs()] == [b"seen", b"b", b"none"]
