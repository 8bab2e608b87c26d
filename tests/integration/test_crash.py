"""SIGKILL at random moments under steady durable load (issue 5).

A producer sends durable messages (each send returns once the broker settled it
`accepted`), a consumer accepts most and fails some (modified{delivery-failed}), and the
broker is killed with SIGKILL at a random moment. After each restart:

* no loss: every message whose send was accepted is still in the queue or was received
  by the consumer before the kill;
* at-least-once, no more: a message is in the queue at most once;
* B-095: a delivery count never comes back lower than the consumer saw it (a count the
  consumer saw at least `SETTLE_MS` before the kill, the time the journal writer has to
  take a record off the loop; an fsync is not needed for a process crash).

`CRASH_ROUNDS` (default 8, ~25 s) sets the number of kills; `make test-long` (CI) runs 40,
and `CRASH_ROUNDS=200 pytest tests/integration/test_crash.py` a longer version.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from proton import Delivery, Message
from support.client import QUEUE, connect, drain
from support.process import BrokerProcess
from support.waiting import wait_until

ROUNDS = int(os.environ.get("CRASH_ROUNDS", "8"))
# 100 ms held on an idle machine; with the other xdist worker and a loaded 2-core host
# the writer thread can be held off the GIL longer (a count seen 0.1-0.3 s before a kill
# is not yet a record: what B-095 promises is "persisted", not "before delivery").
SETTLE_MS = 300
CONFIG = """
persistence:
  enabled: true
  sync: true
address-settings:
  "#":
    max-delivery-attempts: -1
"""

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60 + 6 * ROUNDS)]


@dataclass
class Round:
    """What the clients saw before one kill."""

    accepted: set[int] = field(default_factory=set)
    received: set[int] = field(default_factory=set)
    # msg number -> (largest delivery-count seen, when), for the B-095 check
    counts: dict[int, tuple[int, float]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)


def _produce(broker: BrokerProcess, start: int, seen: Round) -> None:
    with contextlib.suppress(Exception):  # the broker dies under it
        conn = connect(broker.url, timeout=2)
        sender = conn.create_sender("crash", options=QUEUE)
        n = start
        while not seen.stop.is_set():
            sender.send(Message(body=n, durable=True))
            seen.accepted.add(n)
            n += 1


def _consume(broker: BrokerProcess, seen: Round, rng: random.Random) -> None:
    with contextlib.suppress(Exception):
        conn = connect(broker.url, timeout=2)
        receiver = conn.create_receiver("crash", credit=5, options=QUEUE)
        while not seen.stop.is_set():
            message = receiver.receive(timeout=2)
            number = message.body
            seen.received.add(number)
            count, _ = seen.counts.get(number, (-1, 0.0))
            if message.delivery_count >= count:
                seen.counts[number] = (message.delivery_count, time.monotonic())
            if rng.random() < 0.15:
                delivery = receiver.fetcher.unsettled[0]
                delivery.local.failed = True
                receiver.settle(Delivery.MODIFIED)
            else:
                receiver.accept()


def test_sigkill_at_random_moments_loses_no_accepted_message(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "5")))
    next_number = 0
    for round_number in range(ROUNDS):
        broker = spawn(tmp_path, CONFIG, log_level="info")
        # What survived the previous kill is drained at the end of each round, so every
        # round starts from an empty queue and checks only its own messages.
        seen = Round()
        threads = [
            threading.Thread(target=_produce, args=(broker, next_number, seen)),
            threading.Thread(target=_consume, args=(broker, seen, random.Random(round_number))),
        ]
        for thread in threads:
            thread.start()
        wait_until(lambda s=seen: bool(s.accepted), timeout=10, message="a first accepted send")
        time.sleep(rng.uniform(0.0, 0.6))  # the random moment, the load running
        broker.kill()
        killed_at = time.monotonic()
        seen.stop.set()
        for thread in threads:
            thread.join(timeout=10)
        next_number = max(seen.accepted) + 1_000

        broker = spawn(tmp_path, CONFIG, log_level="info")
        try:
            survived = drain(broker.url, "crash", first_timeout=1.5, credit=200)
        finally:
            assert broker.stop() == 0, broker.log()
        numbers = [number for number, _ in survived]
        assert len(numbers) == len(set(numbers)), f"round {round_number}: duplicated in queue"
        lost = seen.accepted - set(numbers) - seen.received
        assert not lost, f"round {round_number}: accepted but lost: {sorted(lost)[:10]}"
        for number, count in survived:
            before, at = seen.counts.get(number, (0, 0.0))
            if killed_at - at >= SETTLE_MS / 1000:
                assert count >= before, (
                    f"round {round_number}: message {number} came back with count {count}, "
                    f"the consumer had seen {before}"
                )
