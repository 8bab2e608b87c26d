"""The triage definitions (tables.py docstring) on small hand-made event frames."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpbroker.analytics import state, tables
from amqpbroker.analytics.schema import CORRUPT_RECORD, EVENT_SCHEMA
from amqpbroker.analytics.tables import TriageSettings

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a window boundary
MINUTE = 60_000


@pytest.fixture(autouse=True)
def _uncache(spark: SparkSession) -> Iterator[None]:
    """What a test cached (as the job caches: `classify`) goes with it."""
    yield
    spark.catalog.clearCache()


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


def test_outcomes_count_ring_and_last_value_replacements(spark: SparkSession) -> None:
    """B-171 `replaced` (B-120, B-121): by reason, beside the other ways out."""
    events = frame(
        spark,
        ev("replaced", 1, reason="ring"),
        ev("replaced", 2, reason="ring"),
        ev("replaced", 3, reason="last-value"),
        ev("killed", 4, reason="purge"),
        ev("acked", 5, reason="accepted"),
    )
    rows = tables.queue_outcomes(tables.event_counts(events, MINUTE)).collect()
    assert sorted((r.event, r.reason, r.events) for r in rows) == [
        ("killed", "purge", 1),
        ("replaced", "last-value", 1),
        ("replaced", "ring", 2),
    ]


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
    poison = tables.poison_candidates(tables.failures(events), events, TriageSettings())
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
        **{"reason": "max-attempts", "target_address": "DLA", "target_queues": ["DLQ.q"], **more},
    )


def _victim(msg_id: int, ts: int, *, body: str | None = "", **more: Any) -> list[dict[str, Any]]:
    """A message failing three times in a row: max-delivery-attempts, no error. Its own
    body unless `body` is given."""
    body = body if body != "" else f"body-{msg_id}"
    return [
        ev("returned", msg_id, ts=ts, reason="modified-failed", body_hash=body, **more),
        ev("returned", msg_id, ts=ts + 1, reason="modified-failed", body_hash=body, **more),
        _dead_letter(msg_id, 1000 + msg_id, ts=ts + 2, body_hash=body, **more),
    ]


def outages_of(
    events: DataFrame, settings: TriageSettings, failed: DataFrame | None = None
) -> tuple[DataFrame, DataFrame]:
    """(failure runs, outages) as the job computes them: from the acks per second and
    the acks it looks up in the store near each run (issue 22 item 8). Cached where the
    job caches (`job.run`): each uncached use recomputed the whole plan, tens of Spark
    jobs a test (docs/decisions.md, "Suite time")."""
    failed = tables.failures(events).cache() if failed is None else failed
    acked = tables.ack_seconds(events).cache()
    runs = tables.failure_runs(failed, acked, settings).cache()
    stored = events.withColumn(CORRUPT_RECORD, F.lit(None).cast("string"))
    return runs, tables.outages(runs, state.acks_near(stored, runs, acked, settings), settings)


def classify(
    spark: SparkSession, events: list[dict[str, Any]], settings: TriageSettings
) -> dict[int, tuple[str, list[str], str | None, str | None]]:
    """copy msg_id -> (queue to drain, also_in, basis, held_back) over the whole chain."""
    frame_ = frame(spark, *events).cache()
    failed = tables.failures(frame_).cache()
    runs, outages = outages_of(frame_, settings, failed)
    # The acks the job looks up in the store (issue 22 item 8), not all of them.
    stored = frame_.withColumn(CORRUPT_RECORD, F.lit(None).cast("string"))
    suspects = tables.poison_suspects(failed, settings).cache()
    acks = state.acks_of_keys(stored, suspects)
    classified = tables.classify_dead_letters(
        tables.still_queued_copies(tables.dead_letters(frame_).cache(), frame_),
        tables.outage_messages(runs, outages.cache()),
        tables.poison_candidates(failed, acks, settings, suspects),
        settings,
    )
    return {r.msg_id: (r.queue, r.also_in, r.basis, r.held_back) for r in classified.collect()}


SETTINGS = TriageSettings(window_ms=MINUTE, outage_min_failures=6, outage_gap_ms=10_000)
HEALTHY_AFTER = [ev("acked", 900 + n, ts=T0 + 20 * MINUTE + n, reason="accepted") for n in range(3)]


def test_redrive_takes_ended_outages_and_transient_conditions_never_poison(
    spark: SparkSession,
) -> None:
    """B-171 copies still in the DLQ; outage over (an ack follows); no poison."""
    outage = [e for m in (1, 2, 3) for e in _victim(m, T0 + 1000 * m)]
    consumed_copy = [ev("acked", 1002, ts=T0 + 3 * MINUTE, queue="DLQ.q", reason="accepted")]
    transient = [
        _dead_letter(
            4,
            1004,
            ts=T0 + 5 * MINUTE,
            reason="rejected",
            error_condition="amqp:resource-limit-exceeded",
        )
    ]
    poison = [e for m in (8, 9) for e in _victim(m, T0 + 2 * MINUTE + m, body="bad")] + [
        _dead_letter(
            10,
            1010,
            ts=T0 + 2 * MINUTE,
            reason="rejected",
            body_hash="bad",
            error_condition="amqp:resource-limit-exceeded",
        )
    ]
    still_failing = [e for m in (11, 12, 13) for e in _victim(m, T0 + 30 * MINUTE + m)]
    got = classify(
        spark,
        [*outage, *consumed_copy, *transient, *poison, *HEALTHY_AFTER, *still_failing],
        SETTINGS,
    )
    assert got == {
        1001: ("DLQ.q", [], "outage-window", None),
        1003: ("DLQ.q", [], "outage-window", None),
        1004: ("DLQ.q", [], "transient-condition", None),
        1008: ("DLQ.q", [], "outage-window", "poison"),
        1009: ("DLQ.q", [], "outage-window", "poison"),
        1010: ("DLQ.q", [], "transient-condition", "poison"),
        1011: ("DLQ.q", [], None, None),  # no ack after: the outage has not ended
        1012: ("DLQ.q", [], None, None),
        1013: ("DLQ.q", [], None, None),
    }


def test_an_outage_never_overrides_an_explicit_non_transient_rejection(
    spark: SparkSession,
) -> None:
    """Issue 22 item 1: a bad deploy rejects 12 different messages `app:schema-violation`
    in a few seconds (a run of failures at 100%, then healthy acks): none is listed;
    max-attempts victims of the same run are."""
    deploy = [
        _dead_letter(
            m,
            1000 + m,
            ts=T0 + 100 * m,
            reason="rejected",
            error_condition="app:schema-violation",
            body_hash=f"b{m}",
        )
        for m in range(1, 13)
    ]
    victims = [e for m in (20, 21) for e in _victim(m, T0 + 1300 + m, body=f"v{m}")]
    got = classify(spark, [*deploy, *victims, *HEALTHY_AFTER], SETTINGS)
    assert {k: v[2] for k, v in got.items()} == {
        **{1000 + m: None for m in range(1, 13)},
        1020: "outage-window",
        1021: "outage-window",
    }


def test_outage_runs_start_at_the_first_failure_not_a_window_boundary(
    spark: SparkSession,
) -> None:
    """Issue 22 item 5: an outage starting 5 s before a minute boundary keeps its first
    victims (fixed windows put them in a window with too few failures). The outage is
    reported with its start, end and failures."""
    start = 10 * MINUTE + T0 + MINUTE - 5_000
    victims = [e for m in range(1, 11) for e in _victim(m, start + 2_000 * m, body=f"p{m}")]
    # Sporadic failures every 40 s before, between acks: never an outage, and no chain
    # that would pull the outage's start back or dilute its rate.
    sporadic = [
        e
        for k in range(1, 15)
        for e in (
            ev("returned", 100 + k, ts=start - 40_000 * k, reason="modified-failed"),
            *[
                ev("acked", 200 + 10 * k + n, ts=start - 40_000 * k + n, reason="accepted")
                for n in range(10)
            ],
        )
    ]
    settings = TriageSettings(window_ms=MINUTE, outage_min_failures=10, outage_gap_ms=60_000)
    everything = [*sporadic, *victims, *HEALTHY_AFTER]
    got = classify(spark, everything, settings)
    assert {k: v[2] for k, v in got.items()} == {1000 + m: "outage-window" for m in range(1, 11)}
    [outage] = outages_of(frame(spark, *everything), settings)[1].collect()
    assert (outage.queue, outage.start_ms, outage.end_ms, outage.failures, outage.acked) == (
        "q",
        start + 2_000,
        start + 20_002,
        30,
        0,
    )
    assert (outage.failing, outage.ended_ms) == (True, T0 + 20 * MINUTE)


def test_a_payload_acked_meanwhile_is_not_poison(spark: SparkSession) -> None:
    """Issue 22 item 5: a shared body (`{"op":"refresh"}`) that an outage failed on five
    messages, but that was acked on the queue in the same period, is no poison: its
    victims are listed. A body never acked stays poison and is held back."""
    refresh = [e for m in range(1, 6) for e in _victim(m, T0 + 1000 * m, body="refresh")]
    poison = [e for m in (6, 7) for e in _victim(m, T0 + 1000 * m, body="bad")]
    acked_before = [ev("acked", 50, ts=T0 - 30_000, reason="accepted", body_hash="refresh")]
    got = classify(spark, [*refresh, *poison, *acked_before, *HEALTHY_AFTER], SETTINGS)
    assert {k: (v[2], v[3]) for k, v in got.items()} == {
        **{1000 + m: ("outage-window", None) for m in range(1, 6)},
        1006: ("outage-window", "poison"),
        1007: ("outage-window", "poison"),
    }


def test_an_unchecked_payload_is_held_back(spark: SparkSession) -> None:
    """Issue 22 item 3: without a body_hash (body-hash off) an outage victim's payload was
    not checked for poison: held back, never listed."""
    victims = [e for m in (1, 2, 3) for e in _victim(m, T0 + 1000 * m, body=None)]
    got = classify(spark, [*victims, *HEALTHY_AFTER], SETTINGS)
    assert {v[3] for v in got.values()} == {"payload-not-checked"}


def test_one_line_per_dead_letter_naming_the_queue_to_drain(spark: SparkSession) -> None:
    """Issue 22 item 4: with the shipped config the copy sits in `DLA` and `DLQ.q` (one
    copy id): one line, draining `DLQ.q`, `also_in` the DLA queue; a copy consumed from
    DLQ.q but still in DLA is named in DLA."""
    both = ["DLA", "DLQ.q"]
    rejected = {"reason": "rejected", "error_condition": "amqp:resource-limit-exceeded"}
    events = [
        _dead_letter(1, 101, ts=T0, target_queues=both, **rejected),
        _dead_letter(2, 102, ts=T0, target_queues=both, **rejected),
        ev("acked", 102, ts=T0 + 5, queue="DLQ.q", reason="accepted"),
    ]
    got = classify(spark, events, SETTINGS)
    assert got == {
        101: ("DLQ.q", ["DLA"], "transient-condition", None),
        102: ("DLA", [], "transient-condition", None),
    }


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
