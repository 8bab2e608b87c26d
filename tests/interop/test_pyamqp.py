"""azure-servicebus 7.x's pure-Python AMQP stack (`_pyamqp`) against the real broker:
every case, one driver process (issue 21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.interop import STACKS, check
from support.process import BrokerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]
STACK = STACKS["pyamqp"]


@pytest.fixture(scope="module")
def results(broker: BrokerProcess, cert_dir: Path) -> dict[str, Any]:
    return STACK.run(broker, cert_dir, mode="cases")


@pytest.mark.parametrize("case", STACK.cases())
def test_pyamqp(results: dict[str, Any], case: str) -> None:
    """Each case in support/interop.py as azure.servicebus._pyamqp expresses it (B-020…B-143)."""
    check(results, case, STACK.prefix)
