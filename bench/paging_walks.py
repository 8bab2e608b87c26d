"""How long a management walk over a paged queue holds the loop (issue 23, h-page).

    .venv/bin/python bench/paging_walks.py [N]      # N=50000 paged 1 KiB messages

The core broker with real page files (no sockets), max-size-bytes 100 kB; messages
alternate `k = 0` / `k = 1`: for purge, count with a filter, purge with a filter that
matches nothing, move of all, and a filtered move and purge that take half (the common
one: a DLQ's moveMessages with a filter), the CPU seconds of the operation and, run as
the HTTP API runs it (`ops.Walk`, a slice at a time, `time.monotonic` as its timer), the
number of slices, the longest and median slice (CPU: each is how long the loop is held)
and the RSS growth over the walk (`rss+`, sampled after each slice). On a checkout
without `ops.Walk` (before issue 23's slicing) each operation is one call: one hold.
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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _paged() -> Harness:
    files = PageFiles(
        Path(tempfile.mkdtemp()), message_of=message_of, page_size_bytes=lambda a: 10 << 20
    )
    files.recover({}, {})
    h = Harness({"#": AddressSettings.of(max_size_bytes=100_000)}, copier=COPIER)
    h.broker.enable_paging(files)
    h.producer("other", "queue")
    target = h.producer("q", "queue")
    bodies = [bytes(ProtonMessage(body="x" * 1000, properties={"k": k}).encode()) for k in (0, 1)]
    for i in range(N):
        h.send(target, bodies[i % 2], props={"k": i % 2})
    return h


def _run(label: str, sync: Callable[[Harness], Any], walk: Callable[[Harness], Any]) -> None:
    h = _paged()
    rss = _rss()
    peak = rss
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
            peak = max(peak, _rss())
            if done:
                break
        result = w.result
    cpu = time.process_time() - started
    print(
        f"{label}: {result} in {cpu:.2f} s CPU ({cpu / N * 1e6:.1f} us a message); "
        f"{len(holds)} slices, longest {max(holds) * 1e3:.1f} ms, "
        f"median {sorted(holds)[len(holds) // 2] * 1e3:.1f} ms, "
        f"last {holds[-1] * 1e3:.1f} ms; rss+ {(max(peak, _rss()) - rss) / 2**20:.1f} MiB",
        flush=True,
    )


def main() -> None:
    b = "q"
    _run("purge", lambda h: ops.purge(h.broker, b), lambda h: ops.purge_walk(h.broker, b))
    _run(
        "move k = 0 (half)",
        lambda h: ops.move(h.broker, b, to_queue="other", selector="k = 0"),
        lambda h: ops.move_walk(h.broker, b, to_queue="other", selector="k = 0"),
    )
    _run(
        "purge k = 0 (half)",
        lambda h: ops.purge(h.broker, b, selector="k = 0"),
        lambda h: ops.purge_walk(h.broker, b, selector="k = 0"),
    )
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
