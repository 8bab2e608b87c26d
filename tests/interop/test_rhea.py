"""rhea 3.0.5 (Node.js) against the real broker: every case, one driver process (issue 21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.interop import STACKS, check
from support.process import BrokerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]
STACK = STACKS["rhea"]


@pytest.fixture(scope="module")
def results(broker: BrokerProcess, cert_dir: Path) -> dict[str, Any]:
    return STACK.run(broker, cert_dir, mode="cases")


@pytest.mark.parametrize("case", STACK.cases())
def test_rhea(results: dict[str, Any], case: str) -> None:
    """Each case in support/interop.py as rhea expresses it (B-020…B-143)."""
    check(results, case, STACK.prefix)


def test_rhea_reads_the_one_byte_boolean_as_a_number(results: dict[str, Any]) -> None:
    """The rhea 3.0.5 bug the drivers work around (interop/README.md): `0x56 0x01` (true,
    as azure's pyamqp encodes it) decodes as 1. When rhea fixes it, drop the fix."""
    assert results["bool_0x56_decoded_as"] == 1


def test_rhea_merges_dispositions_settled_in_one_tick(results: dict[str, Any]) -> None:
    """The other rhea 3.0.5 bug (interop/README.md): `modified` for one delivery and
    `rejected` for the next, in the same tick, leave as one modified disposition over both,
    so the rejected one comes back (delivery-count 1, B-044) instead of being dead-lettered.
    The broker applies what it receives; the drivers settle one delivery at a time."""
    assert results["disposition_merge"] == [
        {"body": "first", "delivery_count": 1},
        {"body": "second", "delivery_count": 1},
    ]
