"""A user who misuses the broker's data directory (crash pass, 2026-11-29): two brokers on
one directory, a key file torn by a kill. Real `amqpbroker run` processes on port 0."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.client import QUEUE, connect, receive_bodies, send
from support.event_files import read_events
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _second_run(first: BrokerProcess, directory: Path) -> subprocess.CompletedProcess[str]:
    """`amqpbroker run` again with the first broker's config and data directory."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            "run",
            "--config",
            str(directory / "broker.yaml"),
            "--data-dir",
            str(first.data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=15,
    )


@pytest.mark.parametrize("persistence", ["true", "false"])
def test_a_second_broker_on_the_same_data_dir_is_refused(
    tmp_path: Path, spawn: Callable[..., BrokerProcess], persistence: str
) -> None:
    """Without persistence there is no journal lock, yet the data directory still holds
    page files (which a start deletes), the message-id block and the event log: the
    second broker must refuse to start, say why, and leave the first one serving."""
    config = f"persistence: {{enabled: {persistence}}}\nevent-log: {{enabled: true}}\n"
    first = spawn(tmp_path, config, log_level="info")
    second = _second_run(first, tmp_path)
    assert second.returncode == 1, second.stdout + second.stderr
    output = second.stdout + second.stderr
    assert "in use by another" in output, output
    assert str(first.data_dir) in output, output
    conn = connect(first.url)
    send(conn, "still.here", "x", caps=("queue",))
    receiver = conn.create_receiver("still.here", credit=1, options=QUEUE)
    assert receive_bodies(receiver, 1) == ["x"]
    conn.close()
    assert first.stop() == 0, first.log()
    # the lock goes with the process: the directory is free again
    again = spawn(tmp_path, config, log_level="info")
    assert again.stop() == 0, again.log()


def test_an_event_log_key_torn_by_a_kill_is_made_again(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """A kill -9 (or a full disk) between creating DATA_DIR/event-log.key and writing its
    32 bytes left an empty key: every later start then wrote events without body_hash
    (`analyze` cannot find poison messages). The broker makes a new key instead."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "event-log.key").write_bytes(b"")
    broker = spawn(tmp_path, "event-log: {enabled: true}\n", log_level="info")
    conn = connect(broker.url)
    send(conn, "hashed", "x", caps=("queue",))
    conn.close()
    assert broker.stop() == 0, broker.log()
    sent = [e for e in read_events(data_dir / "events") if e["event"] == "sent"]
    assert sent
    assert all(e["body_hash"] for e in sent), sent
    assert len((data_dir / "event-log.key").read_bytes()) == 32
