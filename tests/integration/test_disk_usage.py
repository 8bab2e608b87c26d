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
