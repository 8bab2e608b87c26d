"""The console's samples (issue 24) held in arrays allocated once (issue 23: a sample's
objects, kept for the ring's 10 minutes, pinned CPython's arenas that a backlog's
message objects had filled, so RSS stayed up after the backlog was purged)."""

from __future__ import annotations

import dataclasses
import tracemalloc

from amqpbroker.core.operations import QueueStats
from amqpbroker.management.samples import Sampler


def _stats(name: str, messages: int, added: int) -> QueueStats:
    return QueueStats(
        name=name,
        address=name,
        routing_type="ANYCAST",
        durable=False,
        filter=None,
        messages=messages,
        delivering=0,
        scheduled=0,
        consumers=0,
        added=added,
        acknowledged=added - messages,
        dead_lettered=0,
        expired=0,
        killed=0,
        returned=0,
    )


def test_series_and_rates_of_the_kept_samples() -> None:
    """Oldest first, `keep` of them; rates between neighbours; a queue missing from a
    sample breaks its series there."""
    sampler = Sampler(keep=4)
    assert sampler.rates("q") == {"rates": None, "growing": False}
    for i in range(6):  # the first two fall out of the ring
        stats = [_stats("q", 10 * i, 100 * i)] if i != 4 else []
        sampler.take(float(i), stats)
    series = sampler.series("q")
    assert [(e["t"], e["messages"]) for e in series] == [(2.0, 20), (3.0, 30), (5.0, 50)]
    assert series[0]["added"] is None  # nothing before it in the ring
    assert series[1]["added"] == 100.0
    assert series[2]["added"] is None  # the sample before it did not have it
    rates = sampler.rates("q")
    assert rates["growing"] is True
    assert rates["rates"]["added"] == (500 - 200) / 3
    assert sampler.series("other") == []


def test_a_queue_in_no_kept_sample_is_forgotten() -> None:
    sampler = Sampler(keep=3)
    sampler.take(0.0, [_stats("gone", 1, 1), _stats("q", 1, 1)])
    for i in range(1, 4):
        sampler.take(float(i), [_stats("q", 1, 1)])
    assert sampler.series("gone") == []
    assert set(sampler._queues) == {"q"}


def test_a_sample_keeps_no_object_it_made() -> None:
    """Once the ring and the queues' arrays exist, taking samples leaves nothing that it
    allocated alive (but the count of samples taken)."""
    sampler = Sampler(keep=8)
    stats = [_stats(f"q{i}", i, 1000 + i) for i in range(20)]
    for i in range(8):
        sampler.take(1e9 + i, stats)
    stats = [dataclasses.replace(s, messages=s.messages + 70_000) for s in stats]  # not cached
    tracemalloc.start()
    try:
        for i in range(8):
            sampler.take(2e9 + i, stats)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*management/samples.py")]
        )
    finally:
        tracemalloc.stop()
    assert sum(stat.count for stat in snapshot.statistics("lineno")) <= 1
    assert sampler.series("q3")[-1] == {
        "t": 2e9 + 7,
        "messages": 70_003,
        "added": 0.0,
        "acknowledged": 0.0,
        "dead_lettered": 0.0,
        "expired": 0.0,
    }
