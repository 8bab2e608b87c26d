"""Time a /metrics scrape with many queues (target: under 100 ms for 1000 queues).

    .venv/bin/python bench/metrics_scrape.py [--queues 1000] [--scrapes 20]

Runs the real BrokerServer (AMQP and HTTP on port 0) in this process, creates the queues
through the core on the loop, then scrapes http://.../metrics over loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from amqpbroker.config import parse_config
from amqpbroker.core import ConnectionId, Message, ProducerRequest
from amqpbroker.server import BrokerServer

CONFIG = """
acceptors: [{name: amqp, url: "amqp://127.0.0.1:0"}]
http: {bind: "127.0.0.1:0"}
persistence: {enabled: false}
"""


async def main(queues: int, scrapes: int) -> None:
    logging.disable(logging.WARNING)
    server = BrokerServer(parse_config(CONFIG), data_dir=Path(tempfile.mkdtemp()))
    await server.start()
    for i in range(queues):
        target = server.broker.attach_producer(
            ProducerRequest(
                connection=ConnectionId(1), address=f"bench.q{i}", capabilities=("queue",)
            )
        )
        for _ in range(10):
            server.broker.publish(Message(b"x" * 64, annotations={}), target)
    url = f"http://127.0.0.1:{server.ports['http']}/metrics"

    def scrape() -> tuple[float, int]:
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            size = len(response.read())
        return (time.perf_counter() - started) * 1000, size

    loop = asyncio.get_running_loop()
    timings = []
    size = 0
    for _ in range(scrapes):
        took, size = await loop.run_in_executor(None, scrape)
        timings.append(took)
    print(
        f"{queues} queues: /metrics scrape median {statistics.median(timings):.1f} ms, "
        f"max {max(timings):.1f} ms over {scrapes} scrapes ({size:,} bytes)"
    )
    await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.queues, args.scrapes))
