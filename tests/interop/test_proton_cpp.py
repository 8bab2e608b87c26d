"""Qpid Proton C++ 0.37 (Debian) against the real broker: a small C++ client compiled
here, every case it can express in one process (issue 21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.interop import STACKS, check
from support.process import BrokerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]
STACK = STACKS["proton-cpp"]


@pytest.fixture(scope="module")
def results(broker: BrokerProcess, cert_dir: Path) -> dict[str, Any]:
    return STACK.run(broker, cert_dir, mode="cases")


@pytest.mark.parametrize("case", STACK.cases())
def test_proton_cpp(results: dict[str, Any], case: str) -> None:
    """Each case in support/interop.py as Proton C++ expresses it (B-020…B-090)."""
    check(results, case, STACK.prefix)


def test_proton_cpp_modify_is_not_a_failed_delivery(results: dict[str, Any]) -> None:
    """B-044: delivery::modify() sends modified(delivery-failed=false) (client limit, seen
    on the wire), so the redelivery keeps delivery-count 0, exactly as the spec says."""
    assert results["modified"] == [0, 0]
