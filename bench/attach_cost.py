"""CPU cost of one attach and detach of a consumer (an ordinary client's: four outcomes,
one capability) through the real handler, no sockets (issue 15 attack: the count of a
peer's values, `peer.MAX_VALUE_NODES`). Count instructions, not time:

    N=300 valgrind --tool=callgrind .venv/bin/python bench/attach_cost.py
    N=0   valgrind --tool=callgrind .venv/bin/python bench/attach_cost.py   # fixed part

(total - fixed) / N is one attach and detach; 200 warm-up cycles are in both."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from random import Random

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import frames as F

from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.protocol import AmqpConnection, Shell, moves

OUTCOMES = ("amqp:accepted:list", "amqp:rejected:list", "amqp:released:list")


def main() -> None:
    logging.disable(logging.CRITICAL)
    n = int(os.environ.get("N", "3000"))
    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    peer = F.RawPeer(AmqpConnection(Shell(broker), peer="memory"))
    peer.opened()
    source = F.source("q", "queue", outcomes=F.symbols(*OUTCOMES, "amqp:modified:list"))
    attach = F.frame(F.attach("c", role_receiver=True, source=source))
    detach = F.frame(F.detach(handle=0, closed=True))
    connection = peer.connection
    for _ in range(200):
        connection.feed(attach)
        connection.feed(detach)
        connection.output()
    started = time.process_time()
    for _ in range(n):
        connection.feed(attach)
        connection.feed(detach)
        connection.output()
    if n:
        print(f"{(time.process_time() - started) / n * 1e6:.1f} us per attach and detach")


if __name__ == "__main__":
    main()
