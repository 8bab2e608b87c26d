"""The selector language (B-130), identifier resolution (B-131) and broker fields (B-132)."""

from __future__ import annotations

from typing import Any

import pytest

from amqpbroker.core import InvalidSelector, Message
from amqpbroker.core.selector import parse_selector

PROPS: dict[str, Any] = {
    "color": "red",
    "weight": 3,
    "price": 2.5,
    "big": 2**40,
    "flag": True,
    "name": "a_b%c",
    "quote": "it's",
    "neg": -7,
    "zero": 0,
    "blob": b"\x01\x02",
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("color = 'red'", True),
        ("color = 'blue'", False),
        ("color <> 'blue'", True),
        ("weight = 3", True),
        ("weight > 2 AND weight < 4", True),
        ("weight >= 3 AND weight <= 3", True),
        ("weight = 3.0", True),  # numeric promotion
        ("price > 2", True),
        ("price * 2 = 5", True),
        ("weight + 1 = 4", True),
        ("weight - 5 = -2", True),
        ("7 / 2 = 3", True),  # long division, as Java
        ("-7 / 2 = -3", True),  # truncates toward zero
        ("7 % 3 = 1", True),
        ("7.0 / 2 = 3.5", True),
        ("1 + 2 * 3 = 7", True),  # precedence
        ("(1 + 2) * 3 = 9", True),
        ("-weight = -3", True),
        ("+weight = 3", True),
        ("big = 1099511627776", True),
        ("0x10 = 16", True),
        ("010 = 8", True),  # octal
        ("10L = 10", True),
        ("1.5e1 = 15", True),
        (".5 = 0.5", True),
        ("flag = TRUE", True),
        ("flag", True),  # a boolean identifier alone
        ("NOT flag", False),
        ("flag = false", False),  # keywords are case-insensitive
        ("color = 'red' and weight = 3", True),
        ("quote = 'it''s'", True),
        ("color IN ('blue', 'red')", True),
        ("color NOT IN ('blue', 'red')", False),
        ("color IN ('blue')", False),
        ("weight IN ('3')", False),  # IN is for strings
        ("color LIKE 'r%'", True),
        ("color LIKE 'r_d'", True),
        ("color LIKE 'r_'", False),
        ("color NOT LIKE 'b%'", True),
        ("name LIKE 'a\\_b\\%c' ESCAPE '\\'", True),
        ("name LIKE 'a!_b!%c' ESCAPE '!'", True),
        ("name LIKE 'a!_x%' ESCAPE '!'", False),
        ("weight BETWEEN 1 AND 3", True),
        ("weight BETWEEN 4 AND 9", False),
        ("weight NOT BETWEEN 4 AND 9", True),
        ("price BETWEEN 2 AND 3", True),
        ("missing IS NULL", True),
        ("missing IS NOT NULL", False),
        ("color IS NOT NULL", True),
        # three-valued logic: unknown never matches, even negated
        ("missing = 1", False),
        ("missing <> 1", False),
        ("NOT (missing = 1)", False),
        ("missing > 1 OR weight = 3", True),
        ("missing > 1 AND weight = 3", False),
        ("NOT (missing > 1 AND weight = 4)", True),  # unknown AND false = false
        ("NOT (missing > 1 OR weight = 4)", False),  # unknown OR false = unknown
        ("missing BETWEEN 1 AND 2", False),
        ("missing LIKE 'x'", False),
        ("missing IN ('x')", False),
        ("missing + 1 = 2", False),
        # different types
        ("color = 3", False),
        ("color <> 3", True),
        ("weight = '3'", False),
        ("flag = 1", False),
        ("color > 'a'", True),
        # runtime failures do not match
        ("weight / zero = 1", False),
        ("weight % 0 = 1", False),
        # comments and whitespace
        ("color = 'red' -- trailing comment", True),
        ("/* lead */ color = 'red'", True),
        ("  weight=3  ", True),
        ("\"color\" = 'red'", True),  # quoted identifier
        ("neg < 0", True),
        ("blob IS NOT NULL", True),
    ],
)
def test_selector_corpus(selector: str, expected: bool) -> None:
    """B-130: the JMS 2.0 selector grammar with three-valued logic."""
    assert parse_selector(selector).evaluate(PROPS.get) is expected


@pytest.mark.parametrize(
    "selector",
    [
        "color = ",
        "(weight = 1",
        "weight = 1)",
        "weight = = 1",
        "AND weight = 1",
        "weight = 1 AND",
        "color LIKE 'x' ESCAPE 'ab'",
        "color LIKE 'x' ESCAPE ''",
        "color LIKE 5",
        "'unterminated",
        "color IN ()",
        "color IN ('a',)",
        "color IN ('a' 'b')",
        "color IN (1, 2)",
        "weight BETWEEN 1",
        "weight BETWEEN 1 OR 2",
        "color IS 5",
        "color IS NOT",
        "color NOT 5",
        "# = 1",
        "weight = 1 weight = 2",
        "XPATH '//a'",
        "XQUERY 'x'",
        "color = 'red' ;",
        '"unterminated = 1',
        "a @ b",
        "()",
        "NOT",
        "1 +",
        "weight >",
    ],
)
def test_invalid_selectors_are_refused(selector: str) -> None:
    """B-130/B-032: an invalid selector raises InvalidSelector (amqp:invalid-field)."""
    with pytest.raises(InvalidSelector, match="Invalid filter"):
        parse_selector(selector)


@pytest.mark.parametrize("selector", ["", "   ", "hyphenated_props:", "  \n "])
def test_empty_selector_matches_everything(selector: str) -> None:
    """B-130: an empty or whitespace-only filter means no filter."""
    assert parse_selector(selector).evaluate({}.get) is True


def test_hyphenated_props_marker_allows_hyphens_in_identifiers() -> None:
    """B-130: `hyphenated_props:` lets unquoted identifiers contain '-'."""
    selector = parse_selector("hyphenated_props: my-key = 'v' AND n - 1 = 2")
    assert selector.evaluate({"my-key": "v", "n": 3}.get) is True


def _message(**kw: Any) -> Message:
    kw.setdefault("properties", {})
    kw.setdefault("application_properties", {})
    kw.setdefault("annotations", {})
    return Message(b"body", **kw)


@pytest.mark.parametrize(
    ("selector", "fields", "expected"),
    [
        ("AMQPriority = 7", {"priority": 7}, True),
        ("JMSPriority = 7", {"priority": 7}, True),  # B-033: translated everywhere
        ("JMSPriority > 4", {}, False),  # default priority 4
        ("AMQDurable = 'DURABLE'", {"durable": True}, True),
        ("JMSDeliveryMode = 'PERSISTENT'", {"durable": True}, True),
        ("JMSDeliveryMode = 'NON_PERSISTENT'", {"durable": False}, True),
        ("AMQSize = 4", {}, True),
        ("AMQAddress = 'orders'", {"address": "orders"}, True),
        ("AMQExpiration = 0", {}, True),
        ("AMQTimestamp = 1000", {"properties": {"creation-time": 1000}}, True),
        ("AMQTimestamp = 0", {}, True),
        ("JMSMessageID = 'ID:m-1'", {"properties": {"message-id": "m-1"}}, True),
        ("JMSMessageID = 'ID:m-1'", {"properties": {"message-id": "ID:m-1"}}, True),
        ("JMSMessageID IS NULL", {}, True),
        ("AMQGroupID = 'g'", {"properties": {"group-id": "g"}}, True),
        ("JMSXGroupID = 'g'", {"properties": {"group-id": "g"}}, True),
        ("JMSType = 'order'", {"properties": {"subject": "order"}}, True),
        ("JMSCorrelationID = 'c-9'", {"properties": {"correlation-id": "c-9"}}, True),
        ("JMSXUserID = 'bob'", {"properties": {"user-id": b"bob"}}, True),
        (
            "\"m.x-opt-ORIG-ADDRESS\" = 'orders'",
            {"annotations": {"x-opt-ORIG-ADDRESS": "orders"}},
            True,
        ),
        ("_AMQ_ORIG_ADDRESS = 'orders'", {"annotations": {"x-opt-ORIG-ADDRESS": "orders"}}, True),
        ("_AMQ_DLQ_REASON = 'rejected'", {"annotations": {"x-opt-DLQ-REASON": "rejected"}}, True),
        ("__AMQ_CID = 'app-1'", {"origin_container": "app-1"}, True),
        ("color = 'red'", {"application_properties": {"color": "red"}}, True),
        ("AMQUnknown = 1", {"application_properties": {"AMQUnknown": 1}}, True),
    ],
)
def test_identifier_resolution_for_messages(
    selector: str, fields: dict[str, Any], expected: bool
) -> None:
    """B-131/B-132: broker fields, m.<annotation>, JMS names, internal properties."""
    assert parse_selector(selector).matches(_message(**fields)) is expected


def test_internal_properties_cannot_be_spoofed_by_application_properties() -> None:
    """B-131 decision: `_AMQ_*` internal properties are checked before app properties."""
    forged = _message(
        application_properties={"_AMQ_ORIG_ADDRESS": "orders"},
        annotations={"x-opt-ORIG-ADDRESS": "payments"},
    )
    assert not parse_selector("_AMQ_ORIG_ADDRESS = 'orders'").matches(forged)


def test_parsed_selectors_are_cached() -> None:
    assert parse_selector("weight = 1") is parse_selector("weight = 1")
