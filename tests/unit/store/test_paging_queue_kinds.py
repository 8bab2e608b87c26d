"""Queue kinds on a paging address (B-120 with B-151 PAGE, issue 19): a paged message
takes part in the last-value index when it is read back into the queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings
from amqpbroker.core.outcomes import Accepted
from amqpbroker.protocol import message_of
from amqpbroker.store.paging import PageFiles
from tests.support.core_harness import Harness


@pytest.fixture
def files(tmp_path: Path) -> Iterator[PageFiles]:
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 2_000)
    files.recover({}, {})
    yield files
    files.close()


def _body(data: bytes) -> str:
    message = ProtonMessage()
    message.decode(data)
    return str(message.body)


def test_a_paged_value_replaces_the_older_one_when_read_back(files: PageFiles) -> None:
    """B-120 + B-151: k25 sent again while the queue pages is current once read back;
    the older k25 is replaced then, and a consumer never gets it."""
    h = Harness(
        {
            "#": AddressSettings.of(
                max_size_bytes=1_000, max_read_page_bytes=100_000, default_last_value_key="sym"
            )
        }
    )
    h.broker.enable_paging(files)
    target = h.producer("q", "queue")
    keys = [f"k{i}" for i in range(30)] + ["k25"]
    for n, key in enumerate(keys):
        data = ProtonMessage(body=f"{key}-{n}", properties={"sym": key}).encode()
        h.broker.publish(message_of(sections.scan(data)), target)
    queue = h.queue("q")
    assert queue.pages is not None
    assert queue.pages.messages > 0
    c = h.consumer("q", "queue", credit=100)
    got = []
    for d in h.take(c):
        got.append(_body(d.message.data))
        h.broker.settle(c, d.delivery, Accepted())
    assert "k25-25" not in got
    assert got[-1] == "k25-30"
    assert len(got) == 30
    assert queue.counters.replaced_by_reason["last-value"] == 1
