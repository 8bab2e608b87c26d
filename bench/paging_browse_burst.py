"""Run: .venv/bin/python bench/paging_browse_burst.py (from the repository root).

A non-matching browser over N paged messages; then a producer's burst of B paged
messages in one loop turn (no tick): thread CPU of the burst."""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from proton import Message as ProtonMessage

from amqpbroker.core import AddressSettings
from amqpbroker.protocol import message_of
from amqpbroker.store.paging import PageFiles
from tests.support.core_harness import Harness

N, B = 20000, 1000
with tempfile.TemporaryDirectory() as directory:
    files = PageFiles(Path(directory), message_of=message_of, page_size_bytes=lambda a: 1 << 20)
    files.recover({}, {})
    h = Harness({"#": AddressSettings.of(max_size_bytes=1_000, max_read_page_bytes=1_000)})
    h.broker.enable_paging(files)
    target = h.producer("q", "queue")
    data = bytes(ProtonMessage(body="m", properties={"k": "no"}).encode())
    for _ in range(N):
        h.send(target, data, props={"k": "no"})
    for browse in (False, True):
        if browse:
            browser = h.consumer("q", "queue", credit=0, browse=True, selector="k = 'yes'")
            h.broker.set_credit(browser, 10)
        start = time.thread_time()
        for _ in range(B):
            h.send(target, data, props={"k": "no"})
        print(
            f"browser={browse}: {B} paged sends in one turn: "
            f"{(time.thread_time() - start) * 1000:.0f} ms CPU"
        )
    files.close()
