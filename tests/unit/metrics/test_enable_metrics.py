"""`enable-metrics` (B-103, issue 19): false leaves an address and its queues out of /metrics."""

from __future__ import annotations

from support.core_harness import Harness

from amqpbroker.core import AddressSettings
from amqpbroker.metrics import BrokerCollector, BrokerSnapshot, render


def scrape(h: Harness) -> str:
    snapshot = BrokerSnapshot.take(h.broker, connections=0, connections_opened=0)
    return render(BrokerCollector(lambda: snapshot, artemis_names=True)).decode()


def test_enable_metrics_false_hides_the_address_and_its_queues() -> None:
    """B-103 enable-metrics: the unmetered address has no queue, address or Artemis
    series; the other address keeps them, and broker-wide totals count both."""
    h = Harness({"quiet.#": AddressSettings.of(enable_metrics=False)})
    h.send(h.producer("quiet.q", "queue"))
    h.send(h.producer("loud", "queue"))
    text = scrape(h)
    assert 'queue="loud"' in text
    assert 'address="loud"' in text
    assert "quiet" not in text
    assert 'amqpbroker_queue_messages{address="loud",queue="loud",routing_type="ANYCAST"} 1.0' in (
        text
    )
