"""What a careless operator meets at start-up (user pass, session 9): a port another
program holds is one line that names the listener, the address and the key to change."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.process import write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port something else listens on (a second `make run`, say)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("acceptors:\n  - name: amqp\n    url: amqp://127.0.0.1:{port}\n", "acceptor amqp"),
        ("http:\n  bind: 127.0.0.1:{port}\n", "HTTP"),
    ],
)
def test_a_port_in_use_is_one_line_naming_the_listener_and_its_key(
    tmp_path: Path, held_port: int, section: str, named: str
) -> None:
    """Before: the HTTP case said only `cannot start: [Errno 98] Address already in use`,
    the acceptor's named neither the acceptor nor the key."""
    config = write_config(tmp_path, section.format(port=held_port))
    command = ("-m", "amqpbroker", "run", "--config", str(config), "--log-level", "warning")
    run = subprocess.run(
        [sys.executable, *command, "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert run.returncode == 1, run.stderr
    errors = [line for line in run.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, run.stderr
    assert "Traceback" not in run.stderr
    key = "acceptors[].url" if named.startswith("acceptor") else "http.bind"
    assert (
        f"{named}: cannot listen on 127.0.0.1:{held_port}: address already in use" in errors[0]
    ), errors[0]
    assert errors[0].endswith(f"change {key}"), errors[0]
