"""How long a filtered move of a large paged DLQ stalls the broker's other clients, and its
RSS (issue 23, sliced walks): the real broker process, the HTTP API, real AMQP clients.

    .venv/bin/python bench/paging_walk_lag.py [N]      # N=100000 durable 1 KiB messages

Sends N durable messages (`k` alternating 0/1) to `dlq`, which pages past 1 MiB
(max-size-bytes; global-max-size 256 MiB, so the moved copies stay in memory); then,
while a paced client on another queue sends and receives one message every 5 ms, moves
`k = 0` (half) to `moved` over the HTTP API (Artemis moveMessages with a filter on a DLQ).
Prints the walk's wall time, the round trips' max and p99 latency during it and the
second after it (the longest the loop was held, plus the round trip itself), and the
broker's RSS before, at its peak during, and after the walk. Run from another checkout's
directory, the broker (`python -m amqpbroker`, current directory first) is that one.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from proton import Message  # noqa: E402
from support import bulk  # noqa: E402
from support.client import Capabilities, connect  # noqa: E402
from support.process import BrokerProcess, start_broker  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
CONFIG = """
    global-max-size: 268435456
    persistence:
      enabled: true
    address-settings:
      "#": {page-size-bytes: 10485760}
      "dlq": {max-size-bytes: 1048576}
    addresses:
      - name: dlq
        anycast: [{name: dlq}]
      - name: moved
        anycast: [{name: moved}]
      - name: ping
        anycast: [{name: ping}]
    """


def _post(broker: BrokerProcess, path: str, body: dict[str, str]) -> object:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Requested-By": "bench"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=3600) as response:
        return json.loads(response.read())


class _Pinger(threading.Thread):
    """A round trip on `ping` every 5 ms: each one's latency."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.latencies: list[float] = []

    def run(self) -> None:
        conn = connect(self.url, timeout=60)
        sender = conn.create_sender("ping", options=Capabilities("queue"))
        receiver = conn.create_receiver("ping", credit=1, options=Capabilities("queue"))
        while not self.stop.is_set():
            started = time.monotonic()
            sender.send(Message(body="p", durable=False))
            receiver.receive(timeout=600)
            receiver.accept()
            self.latencies.append(time.monotonic() - started)
            time.sleep(0.005)
        conn.close()


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="walk-lag-"))
    broker = start_broker(directory, CONFIG, log_level="warning")
    try:
        started = time.monotonic()
        bulk.send(broker.url, "dlq", range(N), properties=lambda i: {"k": i % 2})
        print(f"sent {N} in {time.monotonic() - started:.1f} s", flush=True)
        before = broker.rss_bytes()
        pinger = _Pinger(broker.url)
        pinger.start()
        while len(pinger.latencies) < 50:  # connected, and going at its pace
            time.sleep(0.1)
        idle = list(pinger.latencies)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], broker.rss_bytes())
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        mark = len(pinger.latencies)
        started = time.monotonic()
        result = _post(broker, "/api/v1/queues/dlq/move", {"to-queue": "moved", "filter": "k = 0"})
        walk = time.monotonic() - started
        time.sleep(1)  # the round trip the walk's last step held ends after its reply
        done.set()
        sampler.join()
        pinger.stop.set()
        pinger.join(timeout=60)
        during = sorted(pinger.latencies[mark:])
        after = broker.rss_bytes()
        mib = 1 << 20
        print(
            f"move k = 0: {result} in {walk:.1f} s; round trips during it: {len(during)}, "
            f"max {during[-1] * 1e3:.0f} ms, p99 {during[len(during) * 99 // 100] * 1e3:.0f} ms "
            f"(idle before: max {max(idle) * 1e3:.0f} ms); RSS {before / mib:.0f} -> "
            f"peak {peak[0] / mib:.0f} -> {after / mib:.0f} MiB",
            flush=True,
        )
    finally:
        broker.stop(timeout=120)


if __name__ == "__main__":
    main()
