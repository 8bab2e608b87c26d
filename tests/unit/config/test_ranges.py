"""Every numeric config key has its range checked (issue 15 item 3, CONTRACT.md "Config
file": out-of-range values are errors that name the key and its line).

Lower bounds as Artemis has them (-1 only where it means unlimited or off), upper bounds
that fit what the code does with the value; YAML and broker.xml alike.
"""

from __future__ import annotations

import math
import textwrap

import pytest

from amqpbroker.config import ConfigError, parse_artemis_xml, parse_config
from amqpbroker.config.load import NUMERIC_KEYS, SETTING_TABLE, Range

HEAD = '<configuration xmlns="urn:activemq">\n<core xmlns="urn:activemq:core">\n'
TAIL = "</core>\n</configuration>\n"


def _too_small(r: Range) -> str:
    if isinstance(r.low, float):
        return repr(r.low - 0.5)
    value = int(r.low) - 1
    return str(-2 if r.minus_one is not None and value == -1 else value)


def _too_large(r: Range) -> str:
    if r.high == math.inf:
        return ".inf"  # a float: finite is its upper bound
    if isinstance(r.high, float):
        return repr(r.high + 0.5)
    return str(int(r.high) + 1)


def _yaml(key: str, value: str) -> tuple[str, int, str]:
    """(YAML text, line, key path) setting `key` of NUMERIC_KEYS to `value`."""
    if key.startswith("queue."):
        name = key.removeprefix("queue.")
        text = f"addresses:\n  - name: a\n    anycast:\n      - name: a\n        {name}: {value}\n"
        return text, 5, f"addresses[0].anycast[0].{name}"
    for section in ("event-log.", "http."):
        if key.startswith(section):
            name = key.removeprefix(section)
            return f"{section[:-1]}:\n  {name}: {value}\n", 2, key
    return f"{key}: {value}\n", 1, key


def _cases() -> list[tuple[str, int, str]]:
    cases = []
    for key, r in NUMERIC_KEYS.items():
        for value in (_too_small(r), _too_large(r)):
            cases.append(_yaml(key, value))
    for field, (kind, check) in SETTING_TABLE.items():
        if kind not in (int, float):
            continue
        assert isinstance(check, Range), f"address-setting {field} has no range"
        key = field.replace("_", "-")
        for value in (_too_small(check), _too_large(check)):
            text = f"address-settings:\n  '#':\n    {key}: {value}\n"
            cases.append((text, 3, f'address-settings."#".{key}'))
    return cases


@pytest.mark.parametrize(("text", "line", "path"), _cases())
def test_every_numeric_key_refuses_values_out_of_its_range(text: str, line: int, path: str) -> None:
    """Issue 15 item 3: too small and too large, each one problem `file:line: key: …`."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="b.yaml")
    [problem] = [str(p) for p in info.value.problems]
    assert problem.startswith(f"b.yaml:{line}: {path}: ")
    assert "must be" in problem or "not a finite number" in problem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "address-settings:\n  '#':\n    max-size-bytes: -5\n",
            'b.yaml:3: address-settings."#".max-size-bytes: must be -1 (unlimited) or >= 0: -5',
        ),
        (
            "id-cache-size: 99999999999999999999\n",
            "b.yaml:1: id-cache-size: must be <= 2147483647: 99999999999999999999",
        ),
        (
            "address-settings:\n  '#':\n    expiry-delay: 1000000000000001\n",
            'b.yaml:3: address-settings."#".expiry-delay: must be <= 1000000000000000: '
            "1000000000000001",
        ),
        (
            "max-redelivery-records: -5\n",
            "b.yaml:1: max-redelivery-records: must be -1 (no cap) or >= 0: -5",
        ),
    ],
)
def test_the_issue_examples_are_refused(text: str, expected: str) -> None:
    """Issue 15 item 3: the values that used to start the broker."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="b.yaml")
    assert [str(p) for p in info.value.problems] == [expected]


@pytest.mark.parametrize(("value", "ok"), [("-1", True), ("0", True), ("-2", False)])
def test_minus_one_means_unlimited_where_artemis_says_so(value: str, ok: bool) -> None:
    text = f"address-settings:\n  '#':\n    max-size-bytes: {value}\n"
    if ok:
        assert parse_config(text, source="b.yaml").address_settings["#"].get(
            "max_size_bytes"
        ) == int(value)
    else:
        with pytest.raises(ConfigError):
            parse_config(text, source="b.yaml")


def test_broker_xml_goes_through_the_same_range_checks() -> None:
    """Issue 15 item 3: broker.xml values are checked as the YAML ones, at their line."""
    body = textwrap.dedent("""\
        <id-cache-size>99999999999999999999</id-cache-size>
        <address-settings>
           <address-setting match="#">
              <max-size-bytes>-5</max-size-bytes>
              <page-size-bytes>4G</page-size-bytes>
           </address-setting>
        </address-settings>
        """)
    with pytest.raises(ConfigError) as info:
        parse_artemis_xml(HEAD + body + TAIL, source="b.xml")
    assert [str(p) for p in info.value.problems] == [
        "b.xml:3: id-cache-size: must be <= 2147483647: 99999999999999999999",
        'b.xml:6: address-settings."#".max-size-bytes: must be -1 (unlimited) or >= 0: -5',
        'b.xml:7: address-settings."#".page-size-bytes: must be <= 2147483647: 4294967296',
    ]
