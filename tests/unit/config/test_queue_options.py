"""The consumer-feature queue options in YAML and broker.xml (B-122…B-128, issue 19), and
how a configured queue takes the ones it leaves unset from `default-*` (B-110)."""

from __future__ import annotations

import textwrap

import pytest

from amqpbroker.config import ConfigError, QueueDef, parse_artemis_xml, parse_config
from amqpbroker.core import ManualClock
from amqpbroker.server import build_broker

YAML = """\
address-settings:
  "#": {default-exclusive-queue: true, default-group-buckets: 16, default-max-consumers: 3}
addresses:
  - name: orders
    anycast:
      - name: orders
        exclusive: false
        purge-on-no-consumers: true
        group-rebalance: true
        group-rebalance-pause-dispatch: true
        group-buckets: 4
        group-first-key: first
        consumers-before-dispatch: 2
        delay-before-dispatch: 500
      - name: plain
"""

XML = """\
<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
<addresses><address name="orders"><anycast>
  <queue name="orders" exclusive="false" purge-on-no-consumers="true" group-rebalance="true"
         group-rebalance-pause-dispatch="true" group-buckets="4" group-first-key="first"
         consumers-before-dispatch="2" delay-before-dispatch="500"/>
</anycast></address></addresses>
</core></configuration>
"""

ORDERS = QueueDef(
    name="orders",
    exclusive=False,
    purge_on_no_consumers=True,
    group_rebalance=True,
    group_rebalance_pause_dispatch=True,
    group_buckets=4,
    group_first_key="first",
    consumers_before_dispatch=2,
    delay_before_dispatch=500,
)


def test_yaml_queue_options() -> None:
    """B-122…B-128: each option is read under its Artemis name."""
    [address] = parse_config(YAML, source="b.yaml").addresses
    assert address.anycast == (ORDERS, QueueDef(name="plain"))


def test_broker_xml_queue_attributes() -> None:
    """The same options as attributes of an Artemis <queue>."""
    [address] = parse_artemis_xml(XML, source="b.xml").addresses
    assert address.anycast == (ORDERS,)


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("group-buckets: -2", "must be -1 (unlimited) or >= 0: -2"),
        ("consumers-before-dispatch: -1", "must be >= 0: -1"),
        ("delay-before-dispatch: -5", "must be -1 (off) or >= 0: -5"),
        ("group-rebalance: maybe", "group-rebalance"),
    ],
)
def test_bad_queue_options_are_refused(option: str, expected: str) -> None:
    """Out-of-range or mistyped options name the key and the line."""
    text = f"addresses:\n  - name: a\n    anycast:\n      - {{name: a, {option}}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="b.yaml")
    [problem] = [str(p) for p in info.value.problems]
    assert problem.startswith("b.yaml:4: addresses[0].anycast[0].")
    assert expected in problem


def test_configured_queue_takes_unset_options_from_default_settings() -> None:
    """B-110 as Artemis applies it: options the queue sets win; the ones it leaves unset
    come from the address's `default-*` settings."""
    config = parse_config(textwrap.dedent(YAML), source="b.yaml")
    broker = build_broker(config, clock=ManualClock())
    orders, plain = broker.queues["orders"].config, broker.queues["plain"].config
    assert (orders.exclusive, orders.group_buckets, orders.max_consumers) == (False, 4, 3)
    assert (orders.consumers_before_dispatch, orders.delay_before_dispatch) == (2, 500)
    assert (plain.exclusive, plain.group_buckets, plain.max_consumers) == (True, 16, 3)
