"""The triage definitions (tables.py docstring) on small hand-made event frames."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from amqpbroker.analytics import tables
from amqpbroker.analytics.schema import EVENT_SCHEMA
from amqpbroker.analytics.tables import TriageSettings

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a window boundary
MINUTE = 60_000


def frame(spark: SparkSession, *events: dict[str, Any]) -> DataFrame:
    """Events with every other B-170 field null."""
    rows = [{name: e.get(name) for name in EVENT_SCHEMA.fieldNames()} for e in events]
    return spark.createDataFrame(rows, EVENT_SCHEMA)


def ev(event: str, msg_id: int, *, ts: int = T0, queue: str = "q", **more: Any) -> dict[str, Any]:
    return {"ts": ts, "event": event, "msg_id": msg_id, "queue": queue, "address": queue, **more}


def at(ms: int) -> datetime.datetime:
    """A window_start as PySpark returns it (naive, session time zone UTC -> local)."""
    return datetime.datetime.fromtimestamp(ms / 1000)


def test_failures_are_failed_returns_and_consumer_dead_letters(spark: SparkSession) -> None:
    """released and plain modified are not failures; modified-failed and rejected are."""
    events = frame(
        spark,
        ev("returned", 1, reason="released"),
        ev("returned", 2, reason="modified"),
        ev("returned", 3, reason="modified-failed"),
        ev("returned", 4, reason="connection-lost"),
        ev("dead-lettered", 5, reason="rejected"),
        ev("dead-lettered", 6, reason="max-attempts"),
        ev("dead-lettered", 7, reason="management"),
        ev("acked", 8, reason="accepted"),
    )
    ids = sorted(r.msg_id for r in tables.failures(events).collect())
    assert ids == [3, 4, 5, 6]


def test_queue_windows_count_per_window_and_rate(spark: SparkSession) -> None:
    """failure_rate = failures / (acked + failures), per queue and window."""
    events = frame(
        spark,
        ev("enqueued", 1, reason="route"),
        ev("enqueued", 2, reason="move"),
        ev("dispatched", 1),
        ev("returned", 1, reason="modified-failed"),
        ev("dispatched", 1),
        ev("acked", 1, reason="accepted"),
        ev("expired", 3, ts=T0 + MINUTE, reason="moved"),
        ev("sent", 9, queue=None),
    )
    counts = tables.event_counts(events, MINUTE)
    expected = [
        ("q", "q", at(T0), 1, 2, 2, 1, 1, 0, 0, 0, 1, 0.5),
        ("q", "q", at(T0 + MINUTE), 0, 0, 0, 0, 0, 0, 1, 0, 0, None),
    ]
    assertDataFrameEqual(
        tables.queue_windows(counts),
        spark.createDataFrame(expected, tables.queue_windows(counts).schema),
    )


def test_poison_needs_the_same_payload_failing_on_several_messages(spark: SparkSession) -> None:
    """One message failing three times is not poison; one payload on two messages is."""
    events = frame(
        spark,
        *[
            ev("returned", 1, reason="modified-failed", body_hash="aaa", connection=c)
            for c in "xyz"
        ],
        ev("returned", 2, reason="modified-failed", body_hash="bbb", connection="x"),
        ev("dead-lettered", 2, reason="rejected", body_hash="bbb", connection=None),
        ev("dead-lettered", 3, reason="rejected", body_hash="bbb", queue="r"),
    )
    poison = tables.poison_candidates(tables.failures(events), TriageSettings())
    rows = [
        (r.key_type, r.key, r.failures, r.messages, r.consumers, r.queues) for r in poison.collect()
    ]
    assert rows == [("body_hash", "bbb", 3, 2, 1, ["q", "r"])]


def _dead_letter(msg_id: int, copy: int, *, ts: int, **more: Any) -> dict[str, Any]:
    return ev(
        "dead-lettered",
        msg_id,
        ts=ts,
        copy_msg_id=copy,
        target_queues=["DLQ.q"],
        **{"reason": "max-attempts", **more},
    )


def test_redrive_takes_ended_outages_and_transient_conditions_never_poison(
    spark: SparkSession,
) -> None:
    """B-171 copies still in the DLQ; outage over (a healthy window follows); no poison."""
    settings = TriageSettings(window_ms=MINUTE, outage_min_failures=2)
    outage = [
        e
        for m in (1, 2)
        for e in (
            ev("returned", m, ts=T0 + m, reason="modified-failed"),
            _dead_letter(m, 100 + m, ts=T0 + 10 + m),
        )
    ]
    healthy_later = [ev("acked", 3, ts=T0 + 2 * MINUTE, reason="accepted")]
    consumed_copy = [ev("acked", 102, ts=T0 + 3 * MINUTE, queue="DLQ.q", reason="accepted")]
    transient = [
        _dead_letter(
            4,
            104,
            ts=T0 + 5 * MINUTE,
            reason="rejected",
            error_condition="amqp:resource-limit-exceeded",
        ),
        ev("acked", 6, ts=T0 + 5 * MINUTE, reason="accepted"),
        ev("acked", 7, ts=T0 + 5 * MINUTE, reason="accepted"),
    ]
    poison = [
        _dead_letter(m, 100 + m, ts=T0 + 6 * MINUTE, reason="rejected", body_hash="bad")
        for m in (8, 9)
    ]
    still_failing = [
        _dead_letter(10, 110, ts=T0 + 7 * MINUTE),
        _dead_letter(11, 111, ts=T0 + 7 * MINUTE),
    ]
    events = frame(
        spark, *outage, *healthy_later, *consumed_copy, *transient, *poison, *still_failing
    )
    counts = tables.event_counts(events, MINUTE)
    windows = tables.queue_windows(counts)
    failed = tables.failures(events)
    dead = tables.dead_letters(events)
    redrive = tables.redrive_candidates(
        tables.still_queued_copies(dead, events),
        tables.outage_messages(failed, windows, settings),
        tables.poison_candidates(failed, TriageSettings(poison_min_failures=2)),
        settings,
    )
    rows = sorted((r.msg_id, r.queue, r.original_queue, r.basis) for r in redrive.collect())
    assert rows == [
        (101, "DLQ.q", "q", "outage-window"),
        (104, "DLQ.q", "q", "transient-condition"),
    ]


def test_attempts_and_time_to_dead_letter(spark: SparkSession) -> None:
    """Final delivery count per message; percentiles of ts - first_ts."""
    events = frame(
        spark,
        ev("acked", 1, delivery_count=1),
        ev("acked", 2, delivery_count=1),
        *[
            ev("dead-lettered", 10 + n, delivery_count=3, first_ts=T0 - 1000 * n)
            for n in range(1, 5)
        ],
    )
    attempts = sorted(
        tuple(r) for r in tables.attempt_distribution(tables.event_counts(events, MINUTE)).collect()
    )
    assert attempts == [("q", "acked", 1, 2), ("q", "dead-lettered", 3, 4)]
    [ttd] = tables.time_to_dead_letter(tables.dead_letters(events)).collect()
    assert (ttd.dead_lettered, ttd.p50_ms, ttd.p90_ms, ttd.max_ms) == (4, 2000, 4000, 4000)
