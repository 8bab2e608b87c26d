"""Prometheus metrics: names (CONTRACT.md "Metrics") and the snapshot collector."""

from amqpbroker.metrics.collector import BrokerCollector, BrokerSnapshot, render

__all__ = ["BrokerCollector", "BrokerSnapshot", "render"]
