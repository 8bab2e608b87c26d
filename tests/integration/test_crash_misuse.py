"""A user who misuses the broker's data directory (crash pass, 2026-11-29): two brokers on
one directory, a key file torn by a kill. Real `amqpbroker run` processes on port 0."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import Message
from proton.utils import SendException
from support.client import QUEUE, connect, receive_bodies, send
from support.event_files import read_events
from support.process import BrokerProcess
from support.waiting import wait_until

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


# `os.fsync` fails with ENOSPC while a marker file exists: the message-id reservation
# (store/idblock.py) syncs with it; the journal's group commit uses fdatasync and works.
FULL_AT_START = """
import errno, os, runpy, sys
marker = sys.argv.pop(1)
real = os.fsync
def failing(fd):
    if os.path.exists(marker):
        raise OSError(errno.ENOSPC, "No space left on device")
    real(fd)
os.fsync = failing
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


def test_a_full_disk_at_start_up_refuses_sends_and_lets_consumers_drain(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """A broker killed on a full disk could not start again ("cannot start: cannot
    reserve message ids ... No space left on device"), so nobody could consume what
    would free the disk. It starts, serves what it stored, refuses sends with
    amqp:resource-limit-exceeded, and takes them again once the disk has room."""
    config = "persistence: {enabled: true}\n"
    broker = spawn(tmp_path, config, log_level="info")
    conn = connect(broker.url)
    send(conn, "full", "stored", durable=True, caps=("queue",))
    conn.close()
    broker.kill()
    marker = tmp_path / "disk-full"
    marker.touch()
    broker = spawn(tmp_path, config, log_level="info", python=("-c", FULL_AT_START, str(marker)))
    assert "cannot reserve message ids" in broker.log()
    conn = connect(broker.url)
    receiver = conn.create_receiver("full", credit=1, options=QUEUE)
    assert receive_bodies(receiver, 1) == ["stored"]
    sender = conn.create_sender("full", options=QUEUE)
    with pytest.raises(SendException) as refused:
        sender.send(Message(body="refused", durable=True))
    assert refused.value.state == 37  # rejected
    marker.unlink()
    deadline = time.monotonic() + 10

    def accepted() -> bool:
        try:
            sender.send(Message(body="later", durable=True))
        except SendException:
            assert time.monotonic() < deadline
            return False
        return True

    wait_until(accepted, timeout=15, message="a send once the disk has room")
    assert receive_bodies(receiver, 1) == ["later"]
    conn.close()
    assert broker.stop() == 0, broker.log()


PAGED = 'address-settings:\n  "pg.#": {max-size-messages: 10, address-full-policy: PAGE}\n'


def test_one_start_without_persistence_does_not_delete_durable_page_files(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-151 PAGE with a config change: a persistent run paged 40 of 50 durable messages;
    one start with `persistence.enabled: false` deleted the page files (a non-persistent
    start clears them) and the next persistent start had 10. It is refused instead,
    naming the directory, and the 50 are all there when persistence is back."""
    persistent = "persistence: {enabled: true}\n" + PAGED
    broker = spawn(tmp_path, persistent, log_level="info")
    conn = connect(broker.url)
    send(conn, "pg.a", *range(50), durable=True, caps=("queue",))
    conn.close()
    assert broker.stop() == 0, broker.log()
    with pytest.raises(AssertionError, match=r"persistence\.enabled: false would delete them"):
        spawn(tmp_path, "persistence: {enabled: false}\n" + PAGED, log_level="info")
    broker = spawn(tmp_path, persistent, log_level="info")
    conn = connect(broker.url)
    receiver = conn.create_receiver("pg.a", credit=10, options=QUEUE)
    assert receive_bodies(receiver, 50) == list(range(50))
    conn.close()
    assert broker.stop() == 0, broker.log()
