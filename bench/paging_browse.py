"""How long one call into the broker holds the event loop while an AMQP browser whose
selector matches nothing walks a paged backlog (issue 23 defect 1).

    .venv/bin/python bench/paging_browse.py            # N=20000 paged messages

The core broker with real page files (no sockets): N messages past max-size-bytes, none
matching the browser's selector. Prints the thread CPU time of the browser's first
dispatch (`set_credit`) and of the loop turns (`tick`) that walk on from there.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proton import Message as ProtonMessage  # noqa: E402

from amqpbroker.core import AddressSettings  # noqa: E402
from amqpbroker.protocol import message_of  # noqa: E402
from amqpbroker.store.paging import PageFiles  # noqa: E402
from tests.support.core_harness import Harness  # noqa: E402

N = int(os.environ.get("N", "20000"))


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        files = PageFiles(Path(directory), message_of=message_of, page_size_bytes=lambda a: 1 << 20)
        files.recover({}, {})
        h = Harness({"#": AddressSettings.of(max_size_bytes=1_000, max_read_page_bytes=1_000)})
        h.broker.enable_paging(files)
        target = h.producer("q", "queue")
        for i in range(N):
            data = bytes(ProtonMessage(body=f"m{i:06d}", properties={"k": "no"}).encode())
            h.send(target, data, props={"k": "no"})
        browser = h.consumer("q", "queue", credit=0, browse=True, selector="k = 'yes'")
        start = time.thread_time()
        h.broker.set_credit(browser, 10)
        first = time.thread_time() - start
        turns, longest, start = 0, 0.0, time.thread_time()
        while (due := h.broker.next_deadline_ms()) is not None and due <= h.clock.now_ms():
            before = time.thread_time()
            h.broker.tick()
            longest = max(longest, time.thread_time() - before)
            turns += 1
        rest = time.thread_time() - start
        print(
            f"N={N}: first dispatch {first * 1000:.1f} ms CPU; then {turns} loop turns, "
            f"{rest * 1000:.0f} ms CPU in all, the longest {longest * 1000:.1f} ms"
        )
        files.close()


if __name__ == "__main__":
    main()
