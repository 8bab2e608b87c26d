"""The cross-client matrix: every stack sends, every stack receives (issue 21).

Each stack's driver runs twice: once to send the typed message set to one queue per
receiver, once to receive from one queue per sender. Bodies (string, binary, map, list),
message-id, content-type and application-properties are compared after decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.interop import STACKS, bare_message, expected, matrix_messages
from support.process import BrokerProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]
PAIRS = [(s, r) for s in STACKS for r in STACKS]


def queue(sender: str, receiver: str) -> str:
    return f"matrix.{sender}.{receiver}"


@pytest.fixture(scope="module")
def matrix(broker: BrokerProcess, cert_dir: Path) -> dict[str, Any]:
    sent = {
        s.name: s.run(
            broker,
            cert_dir,
            mode="send",
            targets=[queue(s.name, r) for r in STACKS],
            messages=matrix_messages(s.name),
        )["sent"]
        for s in STACKS.values()
    }
    received = {
        r.name: r.run(
            broker,
            cert_dir,
            mode="recv",
            sources=[queue(s, r.name) for s in STACKS],
            count=len(matrix_messages("")),
        )["received"]
        for r in STACKS.values()
    }
    return {"sent": sent, "received": received}


@pytest.mark.parametrize(("sender", "receiver"), PAIRS)
def test_matrix(matrix: dict[str, Any], sender: str, receiver: str) -> None:
    """Each message arrives with the same body, id, content-type and properties."""
    got = [
        {k: v for k, v in m.items() if k != "raw"}
        for m in matrix["received"][receiver][queue(sender, receiver)]
    ]
    want = [expected(m) for m in matrix_messages(sender)]
    assert got == want
    assert strict(got) == strict(want)  # Python's True == 1: JSON tells them apart


def strict(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("sender", ["proton-python", "proton-cpp"])
def test_proton_bare_message_is_byte_exact(matrix: dict[str, Any], sender: str) -> None:
    """proton -> proton: the bare message (properties to body) arrives byte for byte as
    the sender encoded it; the broker adds annotations only outside it (B-060)."""
    target = queue(sender, "proton-python")
    sent = [bare_message(bytes.fromhex(m)) for m in matrix["sent"][sender][target]]
    got = [
        bare_message(bytes.fromhex(m["raw"])) for m in matrix["received"]["proton-python"][target]
    ]
    assert len(got) == 4
    assert got == sent
