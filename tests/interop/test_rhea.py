"""rhea (Node.js AMQP 1.0) against the real broker process: any AMQP 1.0 client works."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.process import start_broker

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

RHEA = Path(__file__).resolve().parents[2] / "interop" / "rhea"


@pytest.fixture(scope="module")
def rhea_installed() -> Path:
    """`npm ci` once (the lockfile pins rhea); node and npm are required, not optional."""
    npm = shutil.which("npm")
    assert npm is not None, "interop tests need node and npm on PATH"
    if not (RHEA / "node_modules" / "rhea").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=RHEA,
            check=True,
            capture_output=True,
            timeout=100,
        )
    return RHEA


def test_rhea_modified_then_dead_letter(rhea_installed: Path, tmp_path: Path) -> None:
    """B-044/B-046/B-074/B-090 with rhea: modified(delivery-failed) comes back with
    delivery_count 1; rejected lands in DLA::DLQ.<address> with the ORIG annotations."""
    broker = start_broker(
        tmp_path,
        """
        address-settings:
          "#": {dead-letter-address: DLA, auto-create-dead-letter-resources: true}
        """,
    )
    try:
        result = subprocess.run(
            ["node", "roundtrip.js", str(broker.ports["amqp"]), "interop.orders"],
            cwd=rhea_installed,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        assert broker.stop() == 0
    assert result.returncode == 0, result.stdout + result.stderr + broker.log()
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["accepted_by_broker"] == 2
    assert {"body": "fail-once", "delivery_count": 0} in seen["deliveries"]
    assert {"body": "fail-once", "delivery_count": 1} in seen["deliveries"]
    dead = seen["dead"]
    assert dead["body"] == "poison"
    assert dead["delivery_count"] == 0
    assert dead["annotations"]["x-opt-ORIG-ADDRESS"] == "interop.orders"
    assert dead["annotations"]["x-opt-DLQ-REASON"] == "rejected"
    assert dead["annotations"]["x-opt-DLQ-ERROR-CONDITION"] == "app:poison"


def test_rhea_sasl_plain(rhea_installed: Path, tmp_path: Path) -> None:
    """Issue 8: an independent AMQP stack authenticates with PLAIN; a wrong password is
    refused."""
    from amqpbroker.security import hash_password

    broker = start_broker(
        tmp_path,
        f"""
        security:
          enabled: true
          sasl-mechanisms: [PLAIN]
          users: {{app: {{password-hash: "{hash_password("pw")}", roles: [app]}}}}
          security-settings:
            "#": {{send: [app], create-address: [app], create-durable-queue: [app]}}
        """,
    )
    try:

        def run(password: str) -> dict[str, object]:
            result = subprocess.run(
                ["node", "plain.js", str(broker.ports["amqp"]), "app", password],
                cwd=rhea_installed,
                capture_output=True,
                text=True,
                timeout=30,
            )
            return dict(json.loads(result.stdout.strip().splitlines()[-1]))

        assert run("pw") == {"accepted": True}
        assert "accepted" not in run("wrong")
    finally:
        assert broker.stop() == 0
