"""Cost of the periodic expiry scan (B-084) with many queues and messages.

    .venv/bin/python bench/expiry_scan.py [--queues 100] [--messages 10000]

Fills QUEUES x MESSAGES references with a ttl into the core broker (no sockets, a
ManualClock), then times scans: one with nothing due, one with 1% due, one with all due.
"""

from __future__ import annotations

import argparse
import logging
import time
from random import Random

from amqpbroker.core import (
    Broker,
    ConnectionId,
    ManualClock,
    Message,
    ProducerRequest,
    SettingsRepository,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10_000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # one "dropping expired" warning per queue otherwise
    clock = ManualClock()
    broker = Broker(
        settings=SettingsRepository(),
        clock=clock,
        rng=Random(0),
        message_expiry_scan_period_ms=1000,
    )
    total = args.queues * args.messages
    for q in range(args.queues):
        target = broker.attach_producer(
            ProducerRequest(connection=ConnectionId(1), address=f"q{q}", capabilities=("queue",))
        )
        for i in range(args.messages):
            # 1% expire after 10 s, the rest after an hour
            ttl = 10_000 if i % 100 == 0 else 3_600_000
            broker.publish(Message(b"x" * 100, ttl_ms=ttl, annotations={}), target)
    for label, advance_ms in (("nothing due", 1000), ("1% due", 10_000), ("all due", 3_600_000)):
        clock.advance(advance_ms)
        started = time.perf_counter()
        expired = broker.expire_due(clock.now_ms())
        took_ms = (time.perf_counter() - started) * 1000
        print(
            f"{args.queues} queues x {args.messages} messages ({total:,} refs), "
            f"scan with {label}: {took_ms:8.2f} ms, expired {expired:,}"
        )


if __name__ == "__main__":
    main()
