"""The broker's log lines (issue 15 attack): what a peer sends cannot forge a line."""

from __future__ import annotations

import logging
import sys

from amqpbroker.cli import LOG_FORMAT, OneLineFormatter


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("amqpbroker.x", logging.INFO, __file__, 1, message, args, exc_info)


def test_a_peer_string_with_line_breaks_stays_on_its_line() -> None:
    """A container-id "x\\n<date> ERROR ...: FORGED" made a forged ERROR line of its own."""
    forged = "x\n2026-11-28 15:00:00,000 ERROR   amqpbroker.server: FORGED\r\x1b[31m\u2028"
    line = OneLineFormatter(LOG_FORMAT).format(_record("opened (container %s)", forged))
    assert "\n" not in line
    assert "\r" not in line
    assert "\x1b" not in line
    assert "\u2028" not in line
    assert line.endswith(
        "(container x\\n2026-11-28 15:00:00,000 ERROR   amqpbroker.server: "
        "FORGED\\r\\x1b[31m\\u2028)"
    )


def test_a_traceback_keeps_its_lines_and_tabs_stay() -> None:
    text = OneLineFormatter(LOG_FORMAT).format(_record("failed\there", exc=True))
    first, *rest = text.splitlines()
    assert first.endswith("failed\there")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"
