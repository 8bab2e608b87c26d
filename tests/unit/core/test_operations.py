"""Management operations on queues (B-161): browse, purge, move, retry, stats."""

from __future__ import annotations

import pytest
from support.core_harness import Harness

from amqpbroker.core import AddressSettings, NotFound, Rejected
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
