"""uamqp 1.6.11 (Azure uAMQP-C) against the real broker over amqps only: every case, one
driver process (issue 21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.interop import STACKS, check
from support.process import BrokerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]
STACK = STACKS["uamqp"]


@pytest.fixture(scope="module")
def results(broker: BrokerProcess, cert_dir: Path) -> dict[str, Any]:
    return STACK.run(broker, cert_dir, mode="cases")


@pytest.mark.parametrize("case", STACK.cases())
def test_uamqp(results: dict[str, Any], case: str) -> None:
    """Each case in support/interop.py as uamqp expresses it (B-020…B-143)."""
    check(results, case, STACK.prefix)


def test_uamqp_modify_inverts_undeliverable_here(results: dict[str, Any]) -> None:
    """uamqp 1.6.11 (interop/README.md): modify(failed=True, deliverable=True) puts
    undeliverable-here=true on the wire, so the broker never offers the message to that
    link again and a second link gets it with delivery-count 1 (B-044, B-045)."""
    assert results["probes"]["modify"] == {"same_link_again": False, "other_link_count": 1}


def test_uamqp_refuses_big_frames_at_its_default_frame_size(results: dict[str, Any]) -> None:
    """uamqp 1.6.11: at its default max_frame_size a 200 KiB send fails in its own frame
    codec (the broker offers 128 KiB frames); the drivers raise max_frame_size."""
    assert "SendFailed" in results["probes"]["default_frame_size"]
