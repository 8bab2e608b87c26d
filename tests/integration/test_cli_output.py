"""The CLI's output to a reader that goes away (issue 16 item 5: never a traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_check_config_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    """`amqpbroker check-config FILE | head -1`: exit 1 quietly, like `cat` into `head`."""
    config = tmp_path / "broker.yaml"
    # ~3,000 addresses: far more output than a pipe buffers (64 KiB), so writes fail.
    config.write_text(
        "addresses:\n" + "".join(f"  - name: address.{i}\n    anycast: []\n" for i in range(3000))
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "amqpbroker", "check-config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    with proc.stderr:
        stderr = proc.stderr.read()
    assert proc.wait(timeout=30) == 1
    assert first.startswith(b"# ")
    assert b"Traceback" not in stderr
    assert stderr == b""
