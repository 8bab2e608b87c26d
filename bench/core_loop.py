"""The core alone (`Broker`, no protocol, no sockets), as the server builds it from the
shipped config: for instruction counts of the core's own work per message (issue 20).

    PYTHONPATH=$PWD .venv/bin/python bench/core_loop.py 20000            # us per message
    SCENARIO=fanout PYTHONPATH=$PWD .venv/bin/python bench/core_loop.py  # 4 subscribers
    PROFILE=1 SCENARIO=queue PYTHONPATH=$PWD .venv/bin/python bench/core_loop.py
    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.core \
        .venv/bin/python bench/core_loop.py 3000

SCENARIO: queue (anycast queue, one consumer), fanout (multicast address, FANOUT=4
subscribers, each on its own connection), redelivery (modified{delivery-failed} on the
first delivery, accepted on the second), released (released, then accepted). Messages
are published in batches of 100 (what one socket read holds), the effects taken after
each batch and every delivery settled as the adapter would; the event log's events are
taken and dropped (the hand-off is not the core's). Prints the microseconds per message
(noisy on a shared machine) and, under callgrind, the instruction count of the measured
part is `Ir` of `measured` in callgrind_annotate (`--toggle-collect=measured`).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from amqpbroker.amqp import sections
from amqpbroker.config import load_config
from amqpbroker.core import (
    ACCEPTED,
    FAILED,
    ConnectionId,
    ConsumerId,
    ConsumerRequest,
    Dispatch,
    Message,
    ProducerRequest,
    SystemClock,
)
from amqpbroker.core.outcomes import Released
from amqpbroker.server import build_broker

BATCH = 100
CREDIT = 1000
REPO = Path(__file__).resolve().parent.parent


class _NoPages:
    """The server always hands the broker page stores: `publish` asks `_must_page`."""

    def open(self, *, address: str, queue: str, durable: bool) -> Any:
        raise AssertionError("nothing pages in this bench")

    def flush(self) -> None:
        pass


def setup(scenario: str, fanout: int) -> tuple[Any, Any, list[ConsumerId]]:
    broker = build_broker(load_config(REPO / "config" / "broker.yaml"), clock=SystemClock())
    broker.enable_paging(_NoPages())
    topic = scenario == "fanout"
    address, caps = ("f", ("topic",)) if topic else ("q", ("queue",))
    consumers = []
    for i in range(fanout if topic else 1):
        attached = broker.attach_consumer(
            ConsumerRequest(
                connection=ConnectionId(10 + i),
                container_id=f"consumer{i}",
                link_name=f"c{i}",
                address=address,
                capabilities=caps,
            )
        )
        consumers.append(attached.consumer)
        broker.set_credit(attached.consumer, CREDIT)
    target = broker.attach_producer(
        ProducerRequest(connection=ConnectionId(1), address=address, capabilities=caps)
    )
    broker.take_effects()
    return broker, target, consumers


def encoded() -> bytes:
    from proton import Message as ProtonMessage

    message = ProtonMessage(body="x" * 1000, durable=False)
    message.properties = {"k": "v"}
    message.id = "ID:bench-1"
    return bytes(message.encode())


def run(broker: Any, target: Any, consumers: list[ConsumerId], n: int, scenario: str) -> None:
    raw = encoded()
    scanned = sections.scan(raw)
    redeliver = scenario in ("redelivery", "released")
    outcome_first = FAILED if scenario == "redelivery" else Released()
    seen: set[int] = set()  # returned once already (the first time a message is seen)
    sent = 0
    settle = broker.settle
    publish = broker.publish
    emitter = broker.emitter
    while sent < n:
        for _ in range(min(BATCH, n - sent)):
            message = Message(
                scanned.data,
                durable=False,
                priority=scanned.priority,
                head_end=scanned.head_end(),
                origin_container="producer",
                reader=sections.READER,
            )
            publish(message, target)
            sent += 1
        effects = broker.take_effects()
        while effects:
            for effect in effects:
                if isinstance(effect, Dispatch):
                    msg_id = effect.message.msg_id
                    if redeliver and msg_id not in seen:
                        seen.add(msg_id)
                        settle(effect.consumer, effect.delivery, outcome_first)
                    else:
                        settle(effect.consumer, effect.delivery, ACCEPTED)
            effects = broker.take_effects()
        for consumer in consumers:
            broker.set_credit(consumer, CREDIT)
        broker.take_effects()
        emitter.take_raw()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    scenario = os.environ.get("SCENARIO", "queue")
    fanout = int(os.environ.get("FANOUT", "4"))
    broker, target, consumers = setup(scenario, fanout)
    run(broker, target, consumers, 500, scenario)  # warm-up
    if os.environ.get("PROFILE"):
        profile = cProfile.Profile()
        profile.enable()
        run(broker, target, consumers, n, scenario)
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(35)
        return
    start = time.perf_counter()
    measured(broker, target, consumers, n, scenario)
    elapsed = time.perf_counter() - start
    print(f"{scenario} N={n}: {elapsed * 1e6 / n:.2f} us/message", file=sys.stderr)


def measured(broker: Any, target: Any, consumers: list[ConsumerId], n: int, scenario: str) -> None:
    run(broker, target, consumers, n, scenario)


if __name__ == "__main__":
    main()
