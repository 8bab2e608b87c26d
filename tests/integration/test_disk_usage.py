"""Artemis `max-disk-usage` in a real broker (user pass 2026-11-29, B-095; core/diskguard.py).

The broker runs under a small wrapper whose `shutil.disk_usage` reports the file system
full while a marker file exists: the next check (`disk-scan-period: 50` ms) refuses
durable sends with amqp:resource-limit-exceeded, `amqpbroker_disk_full` is 1, a consumer
still drains and acknowledges; once the marker goes, durable sends are accepted again on
the same link, without a restart.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import Delivery, Message
from proton.utils import SendException
from support.client import QUEUE, connect, receive_bodies
from support.process import BrokerProcess
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CONFIG = "persistence:\n  enabled: true\nmax-disk-usage: 90\ndisk-scan-period: 50\n"
INJECT = """
import os, runpy, shutil, sys
marker = sys.argv.pop(1)
real = shutil.disk_usage
def usage(path):
    found = real(path)
    if os.path.exists(marker):
        return type(found)(found.total, found.total, 0)
    return type(found)(found.total, 0, found.total)
shutil.disk_usage = usage
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


def _disk_full(broker: BrokerProcess) -> float:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    [value] = [
        line.split(" ")[1] for line in text.splitlines() if line.startswith("amqpbroker_disk_full ")
    ]
    return float(value)


def test_durable_sends_are_refused_over_max_disk_usage_and_taken_again_under_it(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    marker = tmp_path / "disk-full"
    broker = spawn(tmp_path, CONFIG, python=("-c", INJECT, str(marker)))
    try:
        conn = connect(broker.url)
        sender = conn.create_sender("guarded", options=QUEUE)
        sender.send(Message(body="before", durable=True))
        marker.touch()
        wait_until(lambda: _disk_full(broker) == 1, timeout=15)
        with pytest.raises(SendException) as refused:
            sender.send(Message(body="refused", durable=True))
        assert refused.value.state == Delivery.REJECTED
        sender.send(Message(body="volatile"))  # non-durable: in memory
        receiver = conn.create_receiver("guarded", credit=10, options=QUEUE)
        assert receive_bodies(receiver, 2) == ["before", "volatile"]  # acked meanwhile
        marker.unlink()
        wait_until(lambda: _disk_full(broker) == 0, timeout=15)
        sender.send(Message(body="after", durable=True))  # accepted, same link
        assert receive_bodies(receiver, 1) == ["after"]
        conn.close()
        assert "beyond max-disk-usage 90%" in broker.log()
        assert "under max-disk-usage 90% again" in broker.log()
    finally:
        assert broker.stop() == 0, broker.log()


# A 10 MB file system 89.5% full (plus what the data directory really holds, so what the
# broker writes shows at its next scan); max-disk-usage 90 leaves ~50 KB of room.
SMALL_DISK = """
import os, runpy, shutil, sys
data_dir = sys.argv.pop(1)
real = shutil.disk_usage
def usage(path):
    held = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data_dir) for f in fs
    )
    total = 10_000_000
    used = 8_950_000 + held
    return type(real(path))(total, used, total - used)
shutil.disk_usage = usage
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


def test_a_fast_producer_is_refused_between_two_scans(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """h-loose: with disk-scan-period 10 minutes, the disk was measured once at start, so a
    producer could write far past max-disk-usage before the next scan. The guard adds
    what the journal wrote since the scan to the usage it measured: a durable send is
    refused once ~50 KB (the room the limit leaves) were written, long before the next
    scan; the messages stored before are all there."""
    config = "persistence:\n  enabled: true\nmax-disk-usage: 90\ndisk-scan-period: 600000\n"
    broker = spawn(tmp_path, config, python=("-c", SMALL_DISK, str(tmp_path / "data")))
    try:
        conn = connect(broker.url)
        sender = conn.create_sender("fast", options=QUEUE)
        accepted = 0
        refused: SendException | None = None
        while refused is None and accepted < 1_000:  # ~1 MB: twenty times the room
            try:
                sender.send(Message(body="x" * 1024, durable=True))
                accepted += 1
            except SendException as e:
                refused = e
        assert refused is not None
        assert refused.state == Delivery.REJECTED
        assert 10 < accepted < 100  # ~50 KB of room, at ~1.1 KB a message
        receiver = conn.create_receiver("fast", credit=accepted + 1, options=QUEUE)
        assert len(receive_bodies(receiver, accepted)) == accepted
        conn.close()
        assert "estimated from what was written since the last scan" in broker.log()
    finally:
        assert broker.stop() == 0, broker.log()
