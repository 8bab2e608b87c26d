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


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_pattern_with_an_empty_word_is_refused_with_its_file_and_line(
    tmp_path: Path, command: str
) -> None:
    """h-loose: `orders..#` (a typo for `orders.#`) was taken silently and matched no
    address of the `orders.#` it meant, leaving them to `#`'s permissions. `check-config`
    and `run` refuse it the same way, one line with file and line, exit 1."""
    config = tmp_path / "broker.yaml"
    config.write_text(
        "security:\n"
        "  security-settings:\n"
        "    '#': {send: [admin]}\n"
        "    'orders..#': {send: [app]}\n"
    )
    args = [str(config)] if command == "check-config" else ["--config", str(config)]
    data = ["--data-dir", str(tmp_path / "data")] if command == "run" else []
    result = subprocess.run(
        [sys.executable, "-m", "amqpbroker", command, *args, *data],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert (
        f"{config}:4: security.security-settings.\"orders..#\": an empty word (two '.' "
        "together): did you mean 'orders.#'?"
    ) in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
