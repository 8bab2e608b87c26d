"""Redelivery and dead-lettering of paged messages, and a filtered retry and move of the
paged dead-letter queue with the `amqpbroker` CLI (issue 23 "Tests": expiry, redelivery
and dead-lettering of paged messages; B-151 with B-065/B-070/B-095 and B-161): the real
broker process, a real AMQP client and the CLI against the HTTP API. Both the queue and
its DLQ page (global-max-size 1 MiB, 3 MiB of messages)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import bulk
from support.client import Capabilities, connect
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
N = 3_000  # 1 KiB durable messages
CONFIG = """
    global-max-size: 1048576
    persistence:
      enabled: true
    address-settings:
      "#": {page-size-bytes: 262144, max-read-page-bytes: 262144, max-delivery-attempts: 2,
            dead-letter-address: DLA, auto-create-dead-letter-resources: true}
    addresses:
      - name: q
        anycast: [{name: q}]
      - name: parked
        anycast: [{name: parked}]
    """


def _queue(broker: BrokerProcess, name: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/{name}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _cli(broker: BrokerProcess, *args: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}"
    done = subprocess.run(
        [sys.executable, "-m", "amqpbroker", *args, "--json", "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_paged_messages_are_redelivered_dead_lettered_and_retried_with_the_cli(
    tmp_path: Path,
) -> None:
    broker = start_broker(tmp_path, CONFIG, log_level="info")
    try:
        assert bulk.send(broker.url, "q", range(N), properties=lambda i: {"k": i % 2}) == N
        assert _queue(broker, "q")["paged_messages"] > N // 2
        # Every delivery fails (modified, delivery-failed): a paged message is read back,
        # redelivered with its count, and dead-lettered at max-delivery-attempts (B-070).
        conn = connect(broker.url, timeout=30)
        receiver = conn.create_receiver("q", credit=20, options=Capabilities("queue"))
        counts: dict[int, list[int]] = {}
        firsts: list[int] = []
        for _ in range(2 * N):
            message = receiver.receive(timeout=30)
            n = int(bytes(message.body[:8]))
            if n not in counts:
                firsts.append(n)
            counts.setdefault(n, []).append(message.delivery_count)
            assert receiver.fetcher is not None
            receiver.fetcher.unsettled[0].local.failed = True  # modified, delivery-failed
            receiver.release(delivered=True)
        conn.close()
        assert firsts == list(range(N))  # in order, paged ones too (B-014)
        assert all(seen == [0, 1] for seen in counts.values())  # B-065/B-095 counts
        dlq = _queue(broker, "DLQ.q")
        assert (dlq["messages"], _queue(broker, "q")["messages"]) == (N, 0)
        assert dlq["paged_messages"] > 0  # the dead-letter queue pages too

        # A filtered retry of the paged DLQ (Artemis retryMessages with a filter), then a
        # filtered move of the rest, with the CLI: each message once, where it was sent.
        assert _cli(broker, "retry", "DLQ.q", "--filter", "k = 0")["retried"] == N // 2
        assert _cli(broker, "move", "DLQ.q", "--to-queue", "parked", "--filter", "k = 1") == {
            "moved": N // 2
        }
        assert _queue(broker, "DLQ.q")["messages"] == 0
        assert bulk.receive(broker.url, "q", N // 2) == list(range(0, N, 2))
        assert bulk.receive(broker.url, "parked", N // 2) == list(range(1, N, 2))
        assert _queue(broker, "q")["messages"] == _queue(broker, "parked")["messages"] == 0
    finally:
        assert broker.stop() == 0, broker.log()
