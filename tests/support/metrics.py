"""Scraping the broker's Prometheus endpoint in tests."""

from __future__ import annotations

import urllib.request

Labels = frozenset[tuple[str, str]]


def parse_metrics(text: str) -> dict[tuple[str, Labels], float]:
    """Prometheus text -> {(name, labels): value}, label order ignored."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def scrape(http_port: int) -> dict[tuple[str, Labels], float]:
    """One scrape of http://127.0.0.1:PORT/metrics, parsed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
        return parse_metrics(response.read().decode())
