"""Consumer features without sockets, with a ManualClock (issue 19): exclusive queues
(B-122), max-consumers (B-125), purge-on-no-consumers (B-126), message groups (B-127),
consumers-before-dispatch / delay-before-dispatch (B-128), consumer priority (B-035)."""

from __future__ import annotations

from typing import Any

import pytest
from support.core_harness import Harness, bodies

from amqpbroker.core import (
    ACCEPTED,
    AddressSettings,
    ConsumerId,
    MaxConsumersReached,
    QueueConfig,
    RoutingType,
)
from amqpbroker.core.dispatch import MessageGroups


def _queue(**options: Any) -> Harness:
    """A harness with a configured ANYCAST queue `q` with these options."""
    h = Harness()
    h.broker.create_address("q", {RoutingType.ANYCAST})
    h.broker.create_queue(
        QueueConfig(name="q", address="q", routing_type=RoutingType.ANYCAST, **options)
    )
    return h


def _send(h: Harness, *items: tuple[bytes, str | None] | bytes, **kw: Any) -> None:
    target = h.producer("q", "queue")
    for item in items:
        body, group = item if isinstance(item, tuple) else (item, None)
        h.send(target, body, group_id=group, **kw)


def _accept_all(h: Harness, consumer: ConsumerId) -> list[bytes]:
    got = h.take(consumer)
    for d in got:
        h.settle(consumer, d, ACCEPTED)
    return bodies(got)


# -- B-122 exclusive queues ---------------------------------------------------------------


def test_exclusive_queue_sends_everything_to_one_consumer() -> None:
    """B-122: all messages go to the first consumer selected, not round-robin."""
    h = _queue(exclusive=True)
    first = h.consumer("q", "queue")
    second = h.consumer("q", "queue")
    _send(h, b"1", b"2", b"3", b"4")
    assert bodies(h.take(first)) == [b"1", b"2", b"3", b"4"]
    assert h.take(second) == []


def test_exclusive_consumer_is_the_highest_priority_one() -> None:
    """B-122 with B-035: the exclusive consumer is the highest-priority one."""
    h = _queue(exclusive=True)
    low = h.consumer("q", "queue", priority=1)
    high = h.consumer("q", "queue", priority=7)
    _send(h, b"1", b"2")
    assert (bodies(h.take(high)), h.take(low)) == ([b"1", b"2"], [])


def test_exclusive_consumer_leaving_returns_its_messages_to_the_next_one() -> None:
    """B-122: the exclusive consumer detaches: its unsettled messages are returned first,
    then a new consumer is selected and gets them in order, then the rest."""
    h = _queue(exclusive=True)
    first = h.consumer("q", "queue", credit=2)
    second = h.consumer("q", "queue")
    _send(h, b"1", b"2", b"3")
    assert bodies(h.take(first)) == [b"1", b"2"]
    assert h.take(second) == []  # b"3" waits for the exclusive consumer's credit
    h.broker.detach_consumer(first, closed=True)
    assert bodies(h.take(second)) == [b"1", b"2", b"3"]


def test_exclusive_queue_ignores_groups() -> None:
    """B-122: message groups are ignored on exclusive queues (no owners recorded)."""
    h = _queue(exclusive=True)
    c = h.consumer("q", "queue")
    _send(h, (b"1", "g"), (b"2", "h"))
    assert bodies(h.take(c)) == [b"1", b"2"]
    policy = h.queue("q").policy
    assert policy is not None
    assert len(policy.groups) == 0


def test_default_exclusive_queue_applies_to_auto_created_queues() -> None:
    """B-110/B-122: `default-exclusive-queue` makes an auto-created queue exclusive."""
    h = Harness({"#": AddressSettings.of(default_exclusive_queue=True)})
    first = h.consumer("auto", "queue")
    second = h.consumer("auto", "queue")
    target = h.producer("auto", "queue")
    for body in (b"1", b"2"):
        h.send(target, body)
    assert h.queue("auto").config.exclusive
    assert (bodies(h.take(first)), h.take(second)) == ([b"1", b"2"], [])


# -- B-125 max-consumers ------------------------------------------------------------------


def test_max_consumers_refuses_the_next_consumer_with_internal_error() -> None:
    """B-125/B-038: the (N+1)-th consumer attach is refused with amqp:internal-error and
    a description naming the queue and the limit; browsers do not count."""
    h = _queue(max_consumers=1)
    h.consumer("q", "queue")
    h.consumer("q", "queue", browse=True)
    with pytest.raises(MaxConsumersReached) as refused:
        h.consumer("q", "queue")
    assert refused.value.condition == "amqp:internal-error"
    assert "queue q" in str(refused.value)
    assert "max-consumers=1" in str(refused.value)


def test_default_max_consumers_applies_to_auto_created_queues() -> None:
    """B-110/B-125: `default-max-consumers` limits an auto-created queue; 0 refuses all."""
    h = Harness({"capped": AddressSettings.of(default_max_consumers=0)})
    with pytest.raises(MaxConsumersReached):
        h.consumer("capped", "queue")
    assert h.queue("capped").config.max_consumers == 0


# -- B-126 purge-on-no-consumers ----------------------------------------------------------


def test_purge_on_no_consumers_queue_is_skipped_while_it_has_no_consumers() -> None:
    """B-126: routing skips the queue while it has no consumers: no route (B-004)."""
    h = _queue(purge_on_no_consumers=True)
    _send(h, b"dropped")
    queue = h.queue("q")
    assert (queue.message_count, queue.counters.added) == (0, 0)
    assert h.broker.post_office.addresses["q"].unrouted == 1
    c = h.consumer("q", "queue")
    _send(h, b"kept")
    assert bodies(h.take(c)) == [b"kept"]


def test_last_consumer_leaving_purges_the_queue_with_its_returned_messages() -> None:
    """B-126: when the last consumer leaves every message is killed (reason
    purge-on-no-consumers), the ones it held unsettled too; event `killed`."""
    h = _queue(purge_on_no_consumers=True)
    c = h.consumer("q", "queue", credit=1)
    _send(h, b"1", b"2", b"3")
    assert bodies(h.take(c)) == [b"1"]
    h.broker.emitter.take()
    h.broker.detach_consumer(c, closed=True)
    queue = h.queue("q")
    assert queue.message_count == 0
    assert queue.counters.killed_by_reason["purge-on-no-consumers"] == 3
    events = [(e.event, e.reason) for e in h.broker.emitter.take() if e.event == "killed"]
    assert events == [("killed", "purge-on-no-consumers")] * 3


def test_purge_waits_for_the_last_consumer() -> None:
    """B-126: a consumer leaving while another stays purges nothing."""
    h = _queue(purge_on_no_consumers=True)
    a = h.consumer("q", "queue", credit=0)
    h.consumer("q", "queue", credit=0)
    _send(h, b"1")
    h.broker.detach_consumer(a, closed=True)
    assert h.queue("q").message_count == 1


def test_default_purge_on_no_consumers_applies_to_auto_created_queues() -> None:
    """B-110/B-126: `default-purge-on-no-consumers` reaches auto-created queues."""
    h = Harness({"#": AddressSettings.of(default_purge_on_no_consumers=True)})
    c = h.consumer("auto", "queue", credit=0)
    h.send(h.producer("auto", "queue"), b"1")
    h.broker.detach_consumer(c, closed=True)
    assert h.queue("auto").config.purge_on_no_consumers
    assert h.queue("auto").counters.killed_by_reason["purge-on-no-consumers"] == 1


# -- B-127 message groups -----------------------------------------------------------------


def test_a_group_sticks_to_the_consumer_that_took_its_first_message() -> None:
    """B-127: later messages of a group go only to its owner; other groups elsewhere."""
    h = _queue()
    a = h.consumer("q", "queue")
    b = h.consumer("q", "queue")
    _send(h, (b"a1", "A"), (b"b1", "B"), (b"a2", "A"), (b"b2", "B"), (b"a3", "A"))
    got_a, got_b = bodies(h.take(a)), bodies(h.take(b))
    assert {tuple(got_a), tuple(got_b)} == {(b"a1", b"a2", b"a3"), (b"b1", b"b2")}
    policy = h.queue("q").policy
    assert policy is not None
    assert len(policy.groups) == 2


def test_a_group_owner_without_credit_keeps_its_messages_waiting() -> None:
    """B-127: the owner's messages are not given to another consumer while it is
    attached; messages of other groups and without a group still flow."""
    h = _queue()
    a = h.consumer("q", "queue", credit=1)
    b = h.consumer("q", "queue")
    _send(h, (b"a1", "A"))
    assert bodies(h.take(a)) == [b"a1"]
    _send(h, (b"a2", "A"), b"plain", (b"c1", "C"))
    assert bodies(h.take(b)) == [b"plain", b"c1"]
    h.broker.set_credit(a, 5)
    assert bodies(h.take(a)) == [b"a2"]


def test_group_sequence_minus_one_closes_the_group() -> None:
    """B-127: group-sequence -1 (0xFFFFFFFF as uint) closes the group after that message,
    so the next message of the group may go to another consumer."""
    h = _queue()
    a = h.consumer("q", "queue")
    b = h.consumer("q", "queue")
    target = h.producer("q", "queue")
    h.send(target, b"1", group_id="G")
    h.send(target, b"last", group_id="G", group_sequence=0xFFFFFFFF)
    policy = h.queue("q").policy
    assert policy is not None
    assert len(policy.groups) == 0
    h.send(target, b"again", group_id="G")
    assert bodies(h.take(a)) == [b"1", b"last"]
    assert bodies(h.take(b)) == [b"again"]  # round-robin moved on: reassigned


def test_owner_leaving_reassigns_the_group_with_its_messages_in_order() -> None:
    """B-127: when the owner detaches its unsettled messages are returned and the group
    goes, in order, to another consumer, which owns it from then on."""
    h = _queue()
    a = h.consumer("q", "queue")
    _send(h, (b"1", "G"), (b"2", "G"))
    assert bodies(h.take(a)) == [b"1", b"2"]
    b = h.consumer("q", "queue")
    h.broker.detach_consumer(a, closed=True)
    _send(h, (b"3", "G"))
    assert bodies(h.take(b)) == [b"1", b"2", b"3"]
    policy = h.queue("q").policy
    assert policy is not None
    assert policy.owner(h.queue("q").refs()[0]) is not None


def test_group_buckets_zero_turns_grouping_off() -> None:
    """B-127: with group-buckets 0 group-ids are ignored: plain round-robin."""
    h = _queue(group_buckets=0)
    a = h.consumer("q", "queue")
    b = h.consumer("q", "queue")
    _send(h, (b"1", "G"), (b"2", "G"))
    assert (bodies(h.take(a)), bodies(h.take(b))) == ([b"1"], [b"2"])
    assert h.queue("q").policy is None


def test_group_buckets_share_an_owner_per_bucket() -> None:
    """B-127: with group-buckets 1 every group hashes to the one bucket, one owner."""
    h = _queue(group_buckets=1)
    a = h.consumer("q", "queue")
    b = h.consumer("q", "queue")
    _send(h, (b"1", "A"), (b"2", "B"), (b"3", "C"))
    assert (bodies(h.take(a)), h.take(b)) == ([b"1", b"2", b"3"], [])


def test_bucket_of_a_group_is_stable() -> None:
    """B-127: a group-id's bucket does not depend on the process (CRC-32, not hash())."""
    groups: MessageGroups[Any] = MessageGroups(16)
    assert groups.key("orders-42") == groups.key("orders-42") == 0  # crc32 % 16


def test_group_rebalance_reassigns_groups_when_a_consumer_arrives() -> None:
    """B-127 group-rebalance: a new consumer clears the owners, so groups spread again."""
    h = _queue(group_rebalance=True)
    a = h.consumer("q", "queue")
    _send(h, (b"1", "G"))
    assert _accept_all(h, a) == [b"1"]
    b = h.consumer("q", "queue")
    policy = h.queue("q").policy
    assert policy is not None
    assert len(policy.groups) == 0
    _send(h, (b"2", "G"))
    assert (h.take(a), bodies(h.take(b))) == ([], [b"2"])


def test_group_rebalance_pause_dispatch_waits_for_deliveries_in_flight() -> None:
    """B-127 group-rebalance-pause-dispatch: after a consumer arrives nothing is
    dispatched until the messages in flight are settled."""
    h = _queue(group_rebalance=True, group_rebalance_pause_dispatch=True)
    a = h.consumer("q", "queue")
    _send(h, (b"1", "G"))
    [held] = h.take(a)
    b = h.consumer("q", "queue")
    _send(h, (b"2", "G"), (b"3", "H"))
    assert (h.take(a), h.take(b)) == ([], [])
    h.settle(a, held, ACCEPTED)
    assert sorted(bodies(h.take(a)) + bodies(h.take(b))) == [b"2", b"3"]


def test_group_first_key_marks_a_new_owners_first_message() -> None:
    """B-127 group-first-key: the first message a consumer gets of a group carries the
    key as application property `true`; later ones and the stored message do not."""
    h = _queue(group_first_key="JMSXGroupFirstForConsumer")
    c = h.consumer("q", "queue")
    _send(h, (b"1", "G"), (b"2", "G"))
    first, second = h.take(c)
    assert first.message.get_application_properties() == {"JMSXGroupFirstForConsumer": True}
    assert second.message.get_application_properties() == {}
    assert h.queue("q").refs()[0].message.get_application_properties() == {}


def test_default_group_settings_apply_to_auto_created_queues() -> None:
    """B-110/B-127: the default-group-* settings reach auto-created queues."""
    h = Harness(
        {
            "#": AddressSettings.of(
                default_group_buckets=8,
                default_group_rebalance=True,
                default_group_rebalance_pause_dispatch=True,
                default_group_first_key="first",
            )
        }
    )
    h.consumer("auto", "queue")
    config = h.queue("auto").config
    assert (
        config.group_buckets,
        config.group_rebalance,
        config.group_rebalance_pause_dispatch,
        config.group_first_key,
    ) == (8, True, True, "first")


# -- B-128 consumers-before-dispatch / delay-before-dispatch --------------------------------


def test_consumers_before_dispatch_holds_messages_until_enough_consumers() -> None:
    """B-128: no dispatch until consumers-before-dispatch consumers are attached."""
    h = _queue(consumers_before_dispatch=2)
    a = h.consumer("q", "queue")
    _send(h, b"1", b"2")
    assert h.take(a) == []
    b = h.consumer("q", "queue")
    assert bodies(h.take(a)) + bodies(h.take(b)) == [b"1", b"2"]


def test_delay_before_dispatch_opens_the_gate_after_the_delay() -> None:
    """B-128: delay-before-dispatch ms after the first consumer attached, the queue
    dispatches even without consumers-before-dispatch consumers (through tick)."""
    h = _queue(consumers_before_dispatch=3, delay_before_dispatch=1_000)
    a = h.consumer("q", "queue")
    _send(h, b"1")
    assert h.broker.next_deadline_ms() == h.clock.now_ms() + 1_000
    h.advance(999)
    assert h.take(a) == []
    h.advance(1)
    assert bodies(h.take(a)) == [b"1"]


def test_dispatch_gate_closes_again_when_every_consumer_left() -> None:
    """B-128: when the last consumer leaves the queue waits for the count again."""
    h = _queue(consumers_before_dispatch=2)
    a = h.consumer("q", "queue")
    b = h.consumer("q", "queue")
    h.broker.detach_consumer(a, closed=True)
    h.broker.detach_consumer(b, closed=True)
    c = h.consumer("q", "queue")
    _send(h, b"1")
    assert h.take(c) == []
    policy = h.queue("q").policy
    assert policy is not None
    assert not policy.dispatching


def test_default_dispatch_gate_applies_to_auto_created_queues() -> None:
    """B-110/B-128: default-consumers-before-dispatch / default-delay-before-dispatch."""
    h = Harness(
        {
            "#": AddressSettings.of(
                default_consumers_before_dispatch=2, default_delay_before_dispatch=50
            )
        }
    )
    c = h.consumer("auto", "queue")
    h.send(h.producer("auto", "queue"), b"1")
    assert h.take(c) == []
    h.advance(50)
    assert bodies(h.take(c)) == [b"1"]


# -- the plain queue ------------------------------------------------------------------------


def test_a_plain_queue_has_no_policy() -> None:
    """Issue 19 cost: a queue without these features and without grouped messages gets
    no `DispatchPolicy` (its dispatch pays one attribute test)."""
    h = _queue()
    c = h.consumer("q", "queue")
    _send(h, b"1", b"2")
    assert bodies(h.take(c)) == [b"1", b"2"]
    assert h.queue("q").policy is None
