"""What a new user copies: the README's Python example and the shipped config (issue 16).

Both run against a real broker whose address-settings and addresses are those of the
shipped config/broker.yaml.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from proton import Message
from support.client import connect, reject_with
from support.process import BrokerProcess
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
README_URL = "amqp://127.0.0.1:5672"


def shipped_routing(*, anycast_everywhere: bool = False) -> str:
    """The address-settings and addresses of config/broker.yaml, as broker config text."""
    shipped = yaml.safe_load((ROOT / "config" / "broker.yaml").read_text())
    settings = shipped["address-settings"]
    if anycast_everywhere:  # the README's advice, applied to "#"
        settings["#"]["default-address-routing-type"] = "ANYCAST"
        settings["#"]["default-queue-routing-type"] = "ANYCAST"
    routing = {"address-settings": settings, "addresses": shipped["addresses"]}
    return str(yaml.safe_dump(routing, sort_keys=False))


def http_get(broker: BrokerProcess, path: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        raw = response.read().decode()
        return json.loads(raw) if "json" in response.headers["Content-Type"] else raw


def open_connections(broker: BrokerProcess) -> float:
    text = http_get(broker, "/metrics")
    (line,) = [line for line in text.splitlines() if line.startswith("amqpbroker_connections ")]
    return float(line.split()[1])


def readme_example() -> str:
    """The first ```python block of the README's "Sending and receiving" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Sending and receiving") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    code = found.group(1)
    assert README_URL in code
    return code


def test_readme_example_acknowledges_its_message(spawn: Any, tmp_path: Path) -> None:
    """Issue 16 item 6: run twice, verbatim but for the port, the queue is empty after each
    run. Without `conn.close()` the `accepted` never left the process and the message came
    back with a higher delivery count every run."""
    broker: BrokerProcess = spawn(tmp_path, shipped_routing())
    code = readme_example().replace(README_URL, broker.url)
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
        )
        assert (done.returncode, done.stdout) == (0, "hello\n"), done.stderr
        wait_until(lambda: open_connections(broker) == 0, timeout=10, message="disconnect")
        queue = http_get(broker, "/api/v1/queues/orders")
        assert (queue["messages"], queue["delivering"]) == (0, 0)
        assert queue["acknowledged"] == queue["added"]
    assert broker.stop() == 0, broker.log()


def test_anycast_under_hash_keeps_per_address_dead_letter_queues(
    spawn: Any, tmp_path: Path
) -> None:
    """Issue 16 item 7 (B-074): the README's ANYCAST advice applied to "#" with the shipped
    DLA entries; a rejected message lands in DLA::DLQ.orders, not the plain DLA queue."""
    broker: BrokerProcess = spawn(tmp_path, shipped_routing(anycast_everywhere=True))
    conn = connect(broker.url)
    try:
        sender = conn.create_sender("orders")  # no capability: ANYCAST from "#"
        receiver = conn.create_receiver("orders")
        for n in range(2):  # an anycast DLQ.orders would get every other one
            sender.send(Message(body=f"poison-{n}"))
            assert receiver.receive(timeout=5).body == f"poison-{n}"
            reject_with(receiver, "app:bad", "cannot parse")
        dlq = conn.create_receiver("DLA::DLQ.orders")
        for n in range(2):
            dead = dlq.receive(timeout=5)
            dlq.accept()
            assert dead.body == f"poison-{n}"
            assert dead.annotations["x-opt-ORIG-ADDRESS"] == "orders"
    finally:
        conn.close()
    assert http_get(broker, "/api/v1/queues/DLQ.orders")["routing_type"] == "MULTICAST"
    assert http_get(broker, "/api/v1/queues/orders")["routing_type"] == "ANYCAST"
    assert broker.stop() == 0, broker.log()
