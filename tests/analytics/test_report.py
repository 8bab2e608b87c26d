"""report.py on plain values (no Spark): plots, commands and warnings (issue 22 item 7)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from amqpbroker.analytics import report
from amqpbroker.analytics.tables import TriageSettings

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000


def results(**more: object) -> report.Results:
    values: dict[str, object] = {
        "events": 10,
        "malformed_lines": 0,
        "first_ts": T0,
        "last_ts": T0 + MINUTE,
        "new_lines": 10,
        "window_ms": MINUTE,
        "queue_totals": [],
        "queue_windows": [],
        "outcomes": [],
        "attempts": [],
        "time_to_dead_letter": [],
        "histogram": [],
        "errors": [],
        "poison": [],
        "redrive_count": 0,
        **more,
    }
    return report.Results(**values)  # type: ignore[arg-type]


def test_failure_rate_plot_is_0_to_100_percent_in_utc_and_broken_at_gaps() -> None:
    """A 0-100% axis whatever the maximum, date and time labels (UTC, said on the axis),
    and no line drawn across minutes without data."""
    svg = report.line_chart(
        {"q": [(T0, 0.1), (T0 + MINUTE, 0.2), (T0 + 5 * MINUTE, 0.1)]},
        y_label="failure rate",
        step_ms=MINUTE,
    )
    assert re.findall(r">(\d+%)<", svg) == ["0%", "25%", "50%", "75%", "100%"]
    assert "2026-01-01 00:00" in svg
    assert "2026-01-01 00:05" in svg
    assert "(times UTC)" in svg
    assert svg.count("<polyline") == 1  # the first two points; the third stands alone
    assert svg.count("<circle") == 1


def test_time_to_dead_letter_buckets_are_contiguous_with_both_bounds() -> None:
    """Power-of-two buckets, empty ones included, each labelled from-to."""
    bars = report.histogram_bars([{"from_ms": 1, "messages": 2}, {"from_ms": 8, "messages": 1}])
    assert bars == [
        ("0 ms-2 ms", {"dead-lettered": 2.0}),
        ("2 ms-4 ms", {"dead-lettered": 0.0}),
        ("4 ms-8 ms", {"dead-lettered": 0.0}),
        ("8 ms-16 ms", {"dead-lettered": 1.0}),
    ]


def test_commands_are_ready_to_run() -> None:
    """The retry per DLQ and the `messages --filter` per poison payload, shell-quoted
    (an id with a quote stays one selector literal)."""
    assert report.retry_command("DLQ.orders", "/tmp/r") == (
        "amqpbroker retry DLQ.orders --ids /tmp/r/redrive/DLQ.orders.jsonl"
    )
    assert (
        report.retry_command("a/b c", "/r")
        == "amqpbroker retry 'a/b c' --ids /r/redrive/a%2Fb%20c.jsonl"
    )
    assert shlex.split(report.messages_command(["orders"], "it's")) == [
        "amqpbroker",
        "messages",
        "DLQ.orders",
        "--filter",
        "AMQUserID = 'ID:it''s'",
    ]


def test_no_body_hash_is_said_loudly() -> None:
    """Item 3: failures without a body_hash: poison detection had nothing to work on."""
    quiet = results(failures=5, hashed_failures=5)
    loud = results(
        failures=5,
        hashed_failures=0,
        redrive_groups=[
            {
                "queue": "DLQ.q",
                "basis": "outage-window",
                "held_back": "payload-not-checked",
                "messages": 4,
            }
        ],
        settings=TriageSettings(),
    )
    assert quiet.warnings() == []
    warnings = loud.warnings()
    assert warnings[0].startswith("POISON DETECTION HAD NOTHING TO WORK ON")
    assert "4 outage dead letter(s) held back" in warnings[1]
    assert "WARNING: POISON DETECTION" in report.terminal_summary(loud, Path("/o"))
