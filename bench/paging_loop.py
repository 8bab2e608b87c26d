"""How long one call into the broker holds the event loop while a paged backlog drains
(issue 23: page files are read on the loop).

    .venv/bin/python bench/paging_loop.py              # N=100000 1 KiB messages
    N=200000 NOGC=1 .venv/bin/python bench/paging_loop.py

The core broker with real page files (no sockets, no sync): a backlog of N messages
past max-size-bytes 8 MiB (default max-read-page-bytes, 20 MiB), then a consumer with
500 credit (proton's prefetch) accepts all of it. Each `set_credit` and `settle` is one
loop step's broker work; its thread CPU time is what it holds the loop for (other
processes on the machine do not count). NOGC=1 turns the garbage collector off, so that
its pauses (which the server handles apart) do not hide the page reads.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proton import Message as ProtonMessage  # noqa: E402

from amqpbroker.core import AddressSettings  # noqa: E402
from amqpbroker.core.outcomes import Accepted  # noqa: E402
from amqpbroker.protocol import message_of  # noqa: E402
from amqpbroker.store.paging import PageFiles  # noqa: E402
from tests.support.core_harness import Harness  # noqa: E402

N = int(os.environ.get("N", "100000"))
CREDIT = 500


def main() -> None:
    if os.environ.get("NOGC") == "1":
        gc.disable()
    with tempfile.TemporaryDirectory() as directory:
        files = PageFiles(
            Path(directory), message_of=message_of, page_size_bytes=lambda a: 10 << 20, sync=False
        )
        files.recover({}, {})
        h = Harness({"#": AddressSettings.of(max_size_bytes=8 << 20)})
        h.broker.enable_paging(files)
        target = h.producer("q", "queue")
        data = ProtonMessage(body="x" * 1000).encode()
        for _ in range(N):
            h.send(target, data)
        consumer = h.consumer("q", "queue", credit=0)
        calls: list[float] = []
        got = 0
        start = time.perf_counter()
        while got < N:
            t = time.thread_time()
            h.broker.set_credit(consumer, CREDIT)
            batch = h.take(consumer)
            calls.append(time.thread_time() - t)
            if not batch:
                raise SystemExit(f"stalled after {got} messages")
            for d in batch:
                t = time.thread_time()
                h.broker.settle(consumer, d.delivery, Accepted())
                calls.append(time.thread_time() - t)
            got += len(batch)
        wall = time.perf_counter() - start
        files.close()
    calls.sort()
    p999 = calls[min(len(calls) - 1, int(0.999 * len(calls)))]
    print(
        f"drained {N} in {wall:.1f} s ({N / wall:,.0f} msg/s); {len(calls)} calls: "
        f"p99.9 {p999 * 1000:.2f} ms, max {calls[-1] * 1000:.1f} ms, "
        f"over 5 ms: {sum(1 for c in calls if c > 0.005)}"
    )


if __name__ == "__main__":
    main()
