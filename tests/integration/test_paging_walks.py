"""A purge or move of a large paged queue over the HTTP API gives the loop back a slice
at a time (issue 23: management operations over paged messages; B-151 with B-161), so a
producer and a consumer on another queue keep being served while it runs, with the real
broker (in a thread, `ThreadBroker`), real AMQP clients and the real HTTP API. The slice
is made small (`SLICE_MESSAGES`) so that a small backlog takes many slices."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from support import bulk
from support.client import Capabilities, connect
from support.inproc import ThreadBroker

from amqpbroker.core import operations as ops

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
N = 4_000  # 1 KiB messages, four times global-max-size
SLICE = 40

CONFIG = """
    global-max-size: 1048576
    persistence:
      enabled: false
    address-settings:
      "#": {page-size-bytes: 262144}
    addresses:
      - name: q
        anycast: [{name: q}]
      - name: other
        anycast: [{name: other}]
      - name: moved
        anycast: [{name: moved}]
    """


def _post(broker: ThreadBroker, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Requested-By": "test"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


class _RoundTrips(threading.Thread):
    """Sends a message to `other` and receives it back, again and again, until told to
    stop: a client of another queue that needs the broker's loop all the time."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = connect(self.url, timeout=30)
            sender = conn.create_sender("other", options=Capabilities("queue"))
            receiver = conn.create_receiver("other", credit=10, options=Capabilities("queue"))
            while not self.stop.is_set():
                sender.send(Message(body=self.done, durable=False))
                assert receiver.receive(timeout=30).body == self.done
                receiver.accept()
                self.done += 1
            conn.close()
        except BaseException as e:  # reported by the test
            self.error = e


@pytest.mark.parametrize("operation", ["purge", "move"])
def test_a_purge_or_move_of_a_paged_queue_lets_another_queue_be_served(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    broker_in_thread: Callable[[str], ThreadBroker],
    operation: str,
) -> None:
    """Every slice of the walk records how many messages `other` had received: they grow
    while the walk runs (the other connection was served between slices; one synchronous
    pass would see one number), the walk takes exactly the N messages, and the queue is
    empty after it (a move's copies are all in `moved`)."""
    monkeypatch.setattr(ops, "SLICE_MESSAGES", SLICE)
    broker = broker_in_thread(CONFIG)
    assert bulk.send(broker.url, "q", range(N), size=1024, durable=lambda i: False) == N
    core = broker.server.broker
    assert core.queues["q"].pages is not None
    assert core.queues["q"].pages.messages > N // 2
    served_then: list[int] = []
    real_slice = ops._slice

    def recording_slice(b: Any, walk: Any) -> bool:
        served_then.append(core.queues["other"].counters.added)
        return real_slice(b, walk)

    monkeypatch.setattr(ops, "_slice", recording_slice)
    client = _RoundTrips(broker.url)
    client.start()
    try:
        bulk_wait = 0
        while client.done < 5 and client.error is None and bulk_wait < 3000:
            threading.Event().wait(0.01)  # the client is up and running
            bulk_wait += 1
        if operation == "purge":
            assert _post(broker, "/api/v1/queues/q/purge", {}) == {"removed": N}
        else:
            assert _post(broker, "/api/v1/queues/q/move", {"to-queue": "moved"}) == {"moved": N}
    finally:
        client.stop.set()
        client.join(timeout=60)
    assert client.error is None, client.error
    assert len(served_then) >= N // SLICE
    assert served_then[-1] > served_then[0], "nothing else was served during the walk"
    assert broker.call(lambda: core.queues["q"].message_count) == 0
    if operation == "move":
        assert broker.call(lambda: core.queues["moved"].message_count) == N
        assert bulk.receive(broker.url, "moved", N) == list(range(N))
