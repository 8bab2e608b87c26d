"""Slow consumers with a ManualClock (issue 19: slow-consumer-threshold / -policy /
-check-period, as Artemis `SlowConsumerReaperRunnable`; core/slowconsumer.py)."""

from __future__ import annotations

import logging

import pytest
from support.core_harness import CONN, Harness

from amqpbroker.core import ACCEPTED, AddressSettings, ConnectionId
from amqpbroker.metrics import BrokerCollector, BrokerSnapshot, render

PERIOD_MS = 5_000  # slow-consumer-check-period 5 (seconds), the default


def _harness(threshold: int = 2, policy: str = "NOTIFY", period_s: int = 5) -> Harness:
    return Harness(
        {
            "orders": AddressSettings.of(
                slow_consumer_threshold=threshold,
                slow_consumer_policy=policy,
                slow_consumer_check_period=period_s,
            )
        }
    )


def _fill(h: Harness, count: int) -> None:
    target = h.producer("orders", "queue")
    for i in range(count):
        h.send(target, b"m%d" % i)


def test_notify_counts_and_logs_a_consumer_that_acknowledges_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 19 NOTIFY: rate 0 < threshold 2 with 20 messages queued: a WARN line naming
    queue, consumer, connection and rate, and the counter by policy; no connection closed."""
    h = _harness()
    _fill(h, 20)
    c = h.consumer("orders", "queue", credit=5)
    assert len(h.take(c)) == 5  # held, never acknowledged
    with caplog.at_level(logging.WARNING, logger="amqpbroker.core.broker"):
        h.advance(PERIOD_MS - 1)
        assert h.broker.stats.slow_consumers == {}  # not checked before the period
        h.advance(1)
    assert h.broker.stats.slow_consumers == {"NOTIFY": 1}
    [line] = [r.getMessage() for r in caplog.records if "slow consumer" in r.getMessage()]
    for named in ("queue orders", f"consumer {c}", f"connection {CONN}", "0.00 messages/s"):
        assert named in line
    assert h.killed == []
    h.advance(PERIOD_MS)
    assert h.broker.stats.slow_consumers == {"NOTIFY": 2}  # reported while it stays slow


def test_kill_asks_the_shell_to_close_the_consumers_connection_once() -> None:
    """Issue 19 KILL: one CloseConnection per connection (two slow consumers on it), with
    amqp:resource-limit-exceeded; a consumer on another connection that keeps up stays."""
    h = _harness(threshold=1, policy="KILL")
    _fill(h, 50)
    h.consumer("orders", "queue", credit=2)
    h.consumer("orders", "queue", credit=2)
    fast_conn = ConnectionId(2)
    fast = h.consumer("orders", "queue", credit=100, conn=fast_conn)
    for d in h.take(fast)[:10]:  # 10 acks in 5 s: 2/s >= 1
        h.settle(fast, d, ACCEPTED)
    h.advance(PERIOD_MS)
    [kill] = h.killed
    assert kill.connection == CONN
    assert kill.condition == "amqp:resource-limit-exceeded"
    assert "slow consumer on queue orders" in kill.description
    assert h.broker.stats.slow_consumers == {"KILL": 2}
    snapshot = BrokerSnapshot.take(h.broker, connections=2, connections_opened=2)
    text = render(BrokerCollector(lambda: snapshot, artemis_names=False)).decode()
    assert 'amqpbroker_slow_consumers_total{policy="KILL"} 2.0' in text


def test_rate_is_measured_per_period_not_since_attach() -> None:
    """Artemis consumer rate: acks since the previous check / its length. 10 acks in the
    first period (2/s) and none in the second: slow at the second check only."""
    h = _harness(threshold=2)
    _fill(h, 40)
    c = h.consumer("orders", "queue", credit=10)
    for d in h.take(c):
        h.settle(c, d, ACCEPTED)
    h.advance(PERIOD_MS)
    assert h.broker.stats.slow_consumers == {}
    h.advance(PERIOD_MS)
    assert h.broker.stats.slow_consumers == {"NOTIFY": 1}


def test_a_queue_with_too_few_messages_makes_no_consumer_slow() -> None:
    """Artemis: the queue must hold at least `threshold` messages (and one) for its
    consumers to be judged; an idle consumer of an empty queue is not slow."""
    h = _harness(threshold=5)
    _fill(h, 4)
    h.consumer("orders", "queue", credit=0)
    h.advance(PERIOD_MS)
    assert h.broker.stats.slow_consumers == {}
    empty = _harness(threshold=0)
    empty.consumer("orders", "queue")
    empty.advance(PERIOD_MS)
    assert empty.broker.stats.slow_consumers == {}


def test_threshold_off_and_browsers_are_never_checked() -> None:
    """slow-consumer-threshold -1 (the default) schedules nothing: no deadline; a browser
    (it never acknowledges) is left out."""
    h = Harness()
    _fill(h, 10)
    h.consumer("orders", "queue")
    assert h.broker._slow_due == []
    b = _harness(threshold=1)
    _fill(b, 10)
    b.consumer("orders", "queue", credit=5, browse=True)
    b.advance(PERIOD_MS)
    assert b.broker.stats.slow_consumers == {}


def test_check_period_drives_the_next_deadline_and_stops_with_the_last_consumer() -> None:
    """slow-consumer-check-period (seconds) is a `next_deadline_ms` deadline (no timer of
    its own); once the queue has no consumer the schedule drops it."""
    h = Harness(
        {"orders": AddressSettings.of(slow_consumer_threshold=1, slow_consumer_check_period=2)},
        address_queue_scan_period_ms=-1,
        message_expiry_scan_period_ms=-1,
    )
    start = h.clock.now_ms()
    c = h.consumer("orders", "queue")
    assert h.broker.next_deadline_ms() == start + 2_000
    h.broker.detach_consumer(c, closed=True)
    h.advance(2_000)
    assert h.broker.next_deadline_ms() is None


def test_settings_added_at_runtime_enrol_queues_that_already_have_consumers() -> None:
    """Issue 19 with B-162 addAddressSettings: a threshold added while a consumer is
    attached takes effect from the next check period, its rate measured from the change."""
    h = Harness()
    _fill(h, 10)
    h.consumer("orders", "queue", credit=1)
    h.advance(PERIOD_MS)
    assert h.broker._slow_due == []
    h.broker.settings.add("orders", AddressSettings.of(slow_consumer_threshold=1))
    h.broker.slow_settings_changed()
    h.advance(PERIOD_MS)
    assert h.broker.stats.slow_consumers == {"NOTIFY": 1}
