"""Config loading: every problem with file, line and key path (CONTRACT.md, STYLE.md §4)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from amqpbroker.config import (
    ConfigError,
    default_config_path,
    format_effective,
    load_config,
    parse_config,
)
from amqpbroker.core import RoutingType, SettingsRepository

REPO = Path(__file__).resolve().parents[3]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), source="b.yaml")
    return [str(p) for p in info.value.problems]


def test_shipped_config_is_the_embedded_default_and_loads() -> None:
    """config/broker.yaml is the embedded default; it sets a DLA (B-046)."""
    assert (REPO / "config" / "broker.yaml").read_text() == default_config_path().read_text()
    config = load_config(default_config_path())
    settings = SettingsRepository(dict(config.address_settings)).resolve("orders")
    assert settings.dead_letter_address == "DLA"
    assert settings.expiry_address == "ExpiryQueue"
    assert [a.name for a in config.addresses] == ["DLA", "ExpiryQueue"]
    assert (config.acceptors[0].host, config.acceptors[0].port) == ("127.0.0.1", 5672)


def test_empty_file_means_all_defaults() -> None:
    config = parse_config("")
    assert config.acceptors[0].url == "amqp://127.0.0.1:5672"
    assert config.address_settings == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "acceptors:\n  - name: a\n    url: amqp://127.0.0.1:0\n    tsl: {}\n",
            "b.yaml:4: acceptors[0].tsl: unknown key (did you mean 'tls'?)",
        ),
        (
            "address-settings:\n  'orders.#':\n    max-delivery-attempts: ten\n",
            "b.yaml:3: address-settings.\"orders.#\".max-delivery-attempts: not an integer: 'ten'",
        ),
        (
            "address-settings:\n  '#':\n    max-delivery-attempts: true\n",
            'b.yaml:3: address-settings."#".max-delivery-attempts: not an integer: True',
        ),
        (
            "address-settings:\n  '#':\n    redelivery-collision-avoidance-factor: 1.5\n",
            'b.yaml:3: address-settings."#".redelivery-collision-avoidance-factor: '
            "must be between 0 and 1: 1.5",
        ),
        (
            "address-settings:\n  '#':\n    redelivery-delay: -5\n",
            'b.yaml:3: address-settings."#".redelivery-delay: must be >= 0: -5',
        ),
        (
            "address-settings:\n  '#':\n    redelivery-delay-multiplier: 0.5\n",
            'b.yaml:3: address-settings."#".redelivery-delay-multiplier: must be >= 1.0: 0.5',
        ),
        (
            "address-settings:\n  '#':\n    default-address-routing-type: BOTH\n",
            'b.yaml:3: address-settings."#".default-address-routing-type: '
            "must be one of ANYCAST, MULTICAST: 'BOTH'",
        ),
        (
            "address-settings:\n  '#':\n    address-full-policy: SPILL\n",
            'b.yaml:3: address-settings."#".address-full-policy: '
            "must be one of PAGE, BLOCK, FAIL, DROP: 'SPILL'",
        ),
        (
            "address-settings:\n  'a.#.b': {}\n",
            "b.yaml:2: address-settings.\"a.#.b\": '#' is allowed only as the last word of a "
            "pattern",
        ),
        (
            "acceptors:\n  - name: a\n    url: amqp://127.0.0.1:99999\n",
            "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
            "(port 0-65535): 'amqp://127.0.0.1:99999'",
        ),
        (
            "acceptors:\n  - name: a\n    url: http://x:1\n",
            "b.yaml:3: acceptors[0].url: expected amqp://HOST:PORT or amqps://HOST:PORT "
            "(port 0-65535): 'http://x:1'",
        ),
        (
            "acceptors:\n  - url: amqp://127.0.0.1:1\n",
            "b.yaml:2: acceptors[0].name: required key is missing",
        ),
        (
            "event-log:\n  level: verbose\n",
            "b.yaml:2: event-log.level: must be one of off, failures, lifecycle: 'verbose'",
        ),
        (
            "http:\n  bind: localhost\n",
            "b.yaml:2: http.bind: expected HOST:PORT (port 0-65535): 'localhost'",
        ),
        (
            "addresses:\n  - name: 'a::b::c'\n",
            "b.yaml:2: addresses[0].name: address name 'a::b::c' has more than one '::'",
        ),
        (
            "addresses:\n  - name: ''\n",
            "b.yaml:2: addresses[0].name: address name must not be empty",
        ),
        ("persistence:\n  sync: maybe\n", "b.yaml:2: persistence.sync: not a boolean: 'maybe'"),
        ("[1, 2]\n", "b.yaml:1: (top level): expected a mapping"),
        ("name: [\n", None),
    ],
)
def test_each_problem_names_file_line_and_key(text: str, expected: str | None) -> None:
    """Every unknown key, wrong type and bad value names file, line and key path."""
    found = problems(text)
    if expected is None:
        assert found[0].startswith("b.yaml:")
        assert "not valid YAML" in found[0]
    else:
        assert expected in found


def test_all_problems_are_reported_together() -> None:
    """One ConfigError lists every problem, not just the first."""
    found = problems("""\
        nmae: x
        acceptors:
          - name: a
            url: amqp://127.0.0.1:0
            tsl: {}
        address-settings:
          '#': {max-delivery-attempts: ten, dead-letter-adress: DLA}
        """)
    assert found == [
        "b.yaml:1: nmae: unknown key (did you mean 'name'?)",
        "b.yaml:5: acceptors[0].tsl: unknown key (did you mean 'tls'?)",
        "b.yaml:7: address-settings.\"#\".max-delivery-attempts: not an integer: 'ten'",
        'b.yaml:7: address-settings."#".dead-letter-adress: unknown key '
        "(did you mean 'dead-letter-address'?)",
    ]


def test_queue_names_are_unique_broker_wide() -> None:
    """B-001: a queue name is unique across the whole broker."""
    found = problems("""\
        addresses:
          - {name: a, anycast: [{name: q}]}
          - {name: b, multicast: [{name: q}]}
        """)
    assert any("queue name 'q' is used more than once" in p for p in found)


def test_every_builtin_address_setting_is_accepted_by_its_kebab_name() -> None:
    """CONTRACT: every B-103 key is accepted under its kebab-case name."""
    config = parse_config(
        textwrap.dedent("""\
        address-settings:
          "#":
            no-expiry: true
            send-to-dla-on-no-route: true
            auto-delete-queues-delay: 5000
            max-redelivery-delay: null
            expiry-delay: 1000
            default-ring-size: 10
            slow-consumer-policy: KILL
        max-redelivery-records: 1
        """)
    )
    settings = SettingsRepository(dict(config.address_settings)).resolve("x")
    assert settings.no_expiry is True
    assert settings.send_to_dla_on_no_route is True
    assert settings.auto_delete_queues_delay == 5000
    assert settings.expiry_delay == 1000
    assert config.max_redelivery_records == 1


def test_overlay_from_config() -> None:
    """B-100: '#', 'orders.#', 'orders.eu' overlay field by field."""
    config = parse_config(
        textwrap.dedent("""\
        address-settings:
          "#": {dead-letter-address: DLA, max-delivery-attempts: 5}
          "orders.#": {max-delivery-attempts: 3, redelivery-delay: 100}
          orders.eu: {redelivery-delay: 7, default-queue-routing-type: ANYCAST}
        """)
    )
    eu = SettingsRepository(dict(config.address_settings)).resolve("orders.eu")
    assert (eu.dead_letter_address, eu.max_delivery_attempts, eu.redelivery_delay) == ("DLA", 3, 7)
    assert eu.default_queue_routing_type is RoutingType.ANYCAST
    assert eu.max_redelivery_delay == 70


def test_addresses_keep_their_routing_types_and_queues() -> None:
    config = parse_config(
        textwrap.dedent("""\
        addresses:
          - name: orders
            anycast:
              - {name: orders, durable: true, max-consumers: 2}
          - name: news
            multicast: []
        """)
    )
    orders, news = config.addresses
    assert orders.anycast[0].max_consumers == 2
    assert news.routing_types == frozenset({"MULTICAST"})


def test_format_effective_shows_resolved_values() -> None:
    """check-config prints the effective settings per configured address."""
    config = parse_config(
        textwrap.dedent("""\
        address-settings:
          "#": {dead-letter-address: DLA}
          "orders.#": {max-delivery-attempts: 3}
        addresses:
          - name: orders.eu
            anycast: [{name: orders.eu}]
        """),
        source="c.yaml",
    )
    text = format_effective(config)
    assert "orders.eu:  # address; queues: orders.eu(ANYCAST)" in text
    block = text.split("orders.eu:  # address")[1]
    assert "max-delivery-attempts: 3" in block
    assert "dead-letter-address: DLA" in block
    assert "matched-by: 'orders.#', '#'" in block


def test_broker_xml_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    """CONTRACT names broker.xml; until it is read, say so instead of a YAML error."""
    path = tmp_path / "broker.xml"
    path.write_text("<configuration/>")
    with pytest.raises(ConfigError, match=r"broker\.xml is not supported"):
        load_config(path)
