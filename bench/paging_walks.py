"""How long a management walk over a paged queue holds the loop (issue 23, h-page).

    .venv/bin/python bench/paging_walks.py [N]      # N=50000 paged 1 KiB messages

The core broker with real page files (no sockets), max-size-bytes 100 kB: for purge,
count with a filter, purge with a filter that matches nothing and move of all, the CPU
seconds of the operation and, run as the HTTP API runs it (`ops.Walk`, a slice at a
time, `time.monotonic` as its timer), the number of slices and the longest and median
slice. On a checkout without `ops.Walk` (before issue 23's slicing) each operation is
one call: one hold.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from proton import Message as ProtonMessage  # noqa: E402
from support.core_harness import Harness  # noqa: E402

from amqpbroker.core import AddressSettings  # noqa: E402
from amqpbroker.core import operations as ops  # noqa: E402
from amqpbroker.protocol import message_of  # noqa: E402
from amqpbroker.protocol.moves import COPIER  # noqa: E402
from amqpbroker.store.paging import PageFiles  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000


def _paged() -> Harness:
    files = PageFiles(
        Path(tempfile.mkdtemp()), message_of=message_of, page_size_bytes=lambda a: 10 << 20
    )
    files.recover({}, {})
    h = Harness({"#": AddressSettings.of(max_size_bytes=100_000)}, copier=COPIER)
    h.broker.enable_paging(files)
    h.producer("other", "queue")
    target = h.producer("q", "queue")
    body = bytes(ProtonMessage(body="x" * 1000, properties={"k": 1}).encode())
    for _ in range(N):
        h.send(target, body, props={"k": 1})
    return h


def _run(label: str, sync: Callable[[Harness], Any], walk: Callable[[Harness], Any]) -> None:
    h = _paged()
    started = time.process_time()
    holds: list[float] = []
    if not hasattr(ops, "Walk"):
        result = sync(h)
        holds.append(time.process_time() - started)
    else:
        w = walk(h)
        w.timer = time.monotonic
        while True:
            t = time.process_time()
            done = w.step()
            holds.append(time.process_time() - t)
            if done:
                break
        result = w.result
    cpu = time.process_time() - started
    print(
        f"{label}: {result} in {cpu:.2f} s CPU ({cpu / N * 1e6:.1f} us a message); "
        f"{len(holds)} slices, longest {max(holds) * 1e3:.1f} ms, "
        f"median {sorted(holds)[len(holds) // 2] * 1e3:.1f} ms",
        flush=True,
    )


def main() -> None:
    b = "q"
    _run("purge", lambda h: ops.purge(h.broker, b), lambda h: ops.purge_walk(h.broker, b))
    _run(
        "count k = 1",
        lambda h: ops.count(h.broker, b, selector="k = 1"),
        lambda h: ops.count_walk(h.broker, b, selector="k = 1"),
    )
    _run(
        "purge k = 2 (none)",
        lambda h: ops.purge(h.broker, b, selector="k = 2"),
        lambda h: ops.purge_walk(h.broker, b, selector="k = 2"),
    )
    _run(
        "move all",
        lambda h: ops.move(h.broker, b, to_queue="other"),
        lambda h: ops.move_walk(h.broker, b, to_queue="other"),
    )


if __name__ == "__main__":
    main()
