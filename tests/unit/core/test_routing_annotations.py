"""The routing type a message's annotations ask for: one table, used by the adapter (B-008
rule 2), the moves (B-090) and retry (B-161) (issue 18 item 4)."""

from __future__ import annotations

from typing import Any

import pytest

from amqpbroker.core import RoutingType, annotated_routing_type
from amqpbroker.core.model import BYTE_OF_ROUTING_TYPE, ROUTING_TYPE_OF_BYTE

A, M = RoutingType.ANYCAST, RoutingType.MULTICAST


@pytest.mark.parametrize(
    ("annotations", "jms_dest", "expected"),
    [
        ({"x-opt-routing-type": 0}, True, M),
        ({"x-opt-routing-type": 1}, True, A),
        ({"x-opt-routing-type": 2}, True, None),
        ({"x-opt-routing-type": "1"}, True, None),
        ({"x-opt-jms-dest": 0}, True, A),  # queue
        ({"x-opt-jms-dest": 1}, True, M),  # topic
        ({"x-opt-jms-dest": 2}, True, A),  # temporary queue
        ({"x-opt-jms-dest": 3}, True, M),  # temporary topic
        ({"x-opt-jms-dest": 4}, True, None),
        ({"x-opt-jms-dest": 1}, False, None),
        ({"x-opt-routing-type": 1, "x-opt-jms-dest": 1}, True, A),  # routing type wins
        ({"x-opt-routing-type": 9, "x-opt-jms-dest": 1}, True, M),
        ({}, True, None),
    ],
)
def test_annotated_routing_type(
    annotations: dict[str, Any], jms_dest: bool, expected: RoutingType | None
) -> None:
    assert annotated_routing_type(annotations, jms_dest=jms_dest) is expected


def test_the_byte_tables_are_inverse() -> None:
    assert {BYTE_OF_ROUTING_TYPE[t]: t for t in RoutingType} == ROUTING_TYPE_OF_BYTE
