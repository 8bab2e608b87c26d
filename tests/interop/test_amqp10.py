"""amqp10 3.6.0 (Node.js) against the real broker: every case, one driver process (issue 21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.interop import STACKS, check
from support.process import BrokerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]
STACK = STACKS["amqp10"]


@pytest.fixture(scope="module")
def results(broker: BrokerProcess, cert_dir: Path) -> dict[str, Any]:
    return STACK.run(broker, cert_dir, mode="cases")


@pytest.mark.parametrize("case", STACK.cases())
def test_amqp10(results: dict[str, Any], case: str) -> None:
    """Each case in support/interop.py as amqp10 expresses it (B-020…B-143)."""
    check(results, case, STACK.prefix)


def test_amqp10_reports_a_sasl_failure_only_through_an_event(results: dict[str, Any]) -> None:
    """amqp10 3.6.0 (interop/README.md): with a wrong password, connect() rejects with a
    bare DisconnectedError; only the client:errorReceived event says SASL failed (outcome
    1, auth). The driver races the event against the promise."""
    report = results["sasl_failure_report"]
    assert report["promise"] == "AmqpDisconnectedError"
    assert "SASL Failed: 1" in report["event"]
