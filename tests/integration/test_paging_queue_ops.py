"""What else goes over a queue's messages, with a paged backlog (issue 23, B-151), with
the real broker (in a thread, `ThreadBroker`) and real AMQP clients: the last consumer
of a purge-on-no-consumers queue leaving (B-126) purges its paged backlog a read step a
loop turn while another queue is served, and a restart brings none of it back; deleting
a queue or an address with a paged backlog (B-162) removes its page files, and a restart
brings none of it back."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from support import bulk
from support.client import Capabilities, connect
from support.inproc import ThreadBroker, start_in_thread
from support.waiting import wait_until

from amqpbroker.core import operations as ops
from amqpbroker.core import queue as queue_module

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
N = 4_000  # 1 KiB durable messages, four times global-max-size
STEP = 20  # messages a read step: a small backlog takes many loop turns

CONFIG = """
    global-max-size: 1048576
    persistence:
      enabled: true
    address-settings:
      "#": {page-size-bytes: 262144, max-read-page-bytes: 262144}
    addresses:
      - name: q
        anycast: [{name: q, purge-on-no-consumers: true}]
      - name: other
        anycast: [{name: other}]
      - name: doomed
        anycast: [{name: doomed}]
    """


def _api(broker: ThreadBroker, path: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}{path}"
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def _manage(url: str, operation: str, *args: Any, resource: str = "broker") -> Any:
    """One operation through the management address (B-160): its answer."""
    conn = connect(url)
    try:
        replies = conn.create_receiver(None, dynamic=True)
        sender = conn.create_sender("activemq.management")
        request = Message(
            body=json.dumps(args),
            properties={"_AMQ_ResourceName": resource, "_AMQ_OperationName": operation},
            reply_to=replies.remote_source.address,
            id="req-1",
        )
        sender.send(request)
        reply = replies.receive(timeout=120)
        replies.accept()
        assert reply.properties["_AMQ_OperationSucceeded"], reply.body
        (answer,) = json.loads(reply.body)
        return answer
    finally:
        conn.close()


class _RoundTrips(threading.Thread):
    """Sends a message to `other` and receives it back until told to stop: a client of
    another queue that needs the broker's loop all the time."""

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


def test_the_last_consumer_leaving_purges_a_paged_backlog_while_others_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-126 over B-151: a receiver without credit keeps the queue routed to while N
    durable messages are sent (most of them paged); it detaches: the queue is purged,
    every message killed once, the page files emptied, and a client of another queue
    is served between the purge's steps (before: one loop turn for the whole paged
    backlog). After a restart the queue is still empty; what is sent to it once a new
    receiver is attached is delivered."""
    monkeypatch.setattr(queue_module, "READ_STEP_MESSAGES", STEP)
    broker = start_in_thread(tmp_path, CONFIG)
    try:
        core = broker.server.broker
        conn = connect(broker.url)
        idle = conn.create_receiver("q", credit=0, options=Capabilities("queue"))
        assert bulk.send(broker.url, "q", range(N), size=1024) == N
        paged = broker.call(lambda: core.queues["q"].pages.messages)
        assert paged > N // 2
        served_then: list[int] = []
        real_step = queue_module.Queue.purge_paged_step

        def recording_step(queue: queue_module.Queue, *args: Any, **kw: Any) -> Any:
            served_then.append(core.queues["other"].counters.added)
            return real_step(queue, *args, **kw)

        monkeypatch.setattr(queue_module.Queue, "purge_paged_step", recording_step)
        client = _RoundTrips(broker.url)
        client.start()
        try:
            wait_until(lambda: client.done >= 5 or client.error, timeout=60)
            idle.close()
            wait_until(
                lambda: broker.call(lambda: core.queues["q"].message_count) == 0,
                timeout=120,
                message="the purge",
            )
        finally:
            client.stop.set()
            client.join(timeout=60)
        assert client.error is None, client.error
        assert len(served_then) >= paged // STEP
        assert served_then[-1] > served_then[0], "nothing else was served during the purge"
        row = _api(broker, "/api/v1/queues/q")
        assert (row["messages"], row["paged_messages"], row["paged_bytes"]) == (0, 0, 0)
        assert row["killed"] == N
        killed = broker.call(lambda: dict(core.queues["q"].counters.killed_by_reason))
        assert {reason: n for reason, n in killed.items() if n} == {"purge-on-no-consumers": N}
        directory = broker.data_dir / "paging" / "q"
        files = lambda: [path for path in directory.rglob("*") if path.is_file()]  # noqa: E731
        wait_until(  # the files go once a cursor past them is on disk; the one being
            lambda: len(files()) <= 1,  # written stays (as after a management purge)
            timeout=30,
            message="the page files to go",
        )
        conn.close()
    finally:
        broker.stop()
    again = start_in_thread(tmp_path, CONFIG)
    try:
        assert _api(again, "/api/v1/queues/q")["messages"] == 0
        conn = connect(again.url)
        receiver = conn.create_receiver("q", credit=10, options=Capabilities("queue"))
        sender = conn.create_sender("q", options=Capabilities("queue"))
        for i in range(3):
            sender.send(Message(body=f"after-{i}", durable=True))
        got = [receiver.receive(timeout=30).body for _ in range(3)]
        receiver.accept()
        assert got == ["after-0", "after-1", "after-2"]
        conn.close()
    finally:
        again.stop()


@pytest.mark.parametrize("how", ["queue", "address"])
def test_deleting_a_queue_with_a_paged_backlog_removes_its_page_files_for_good(
    tmp_path: Path, how: str
) -> None:
    """B-162 destroyQueue / deleteAddress(force) over B-151: the page files of a queue
    with a durable paged backlog go with it (the directory too), and a restart brings
    back neither the queue's messages nor its files; a queue of the same name created
    afterwards starts empty."""
    broker = start_in_thread(tmp_path, CONFIG)
    try:
        assert bulk.send(broker.url, "doomed", range(N), size=1024) == N
        directory = broker.data_dir / "paging" / "doomed"
        assert any(path.is_file() for path in directory.rglob("*"))
        assert _api(broker, "/api/v1/queues/doomed")["paged_messages"] > N // 2
        if how == "queue":
            _manage(broker.url, "destroyQueue", "doomed")
        else:
            _manage(broker.url, "deleteAddress", "doomed", True)
        assert not directory.exists()
    finally:
        broker.stop()
    again = start_in_thread(tmp_path, CONFIG)
    try:
        assert not (again.data_dir / "paging" / "doomed").exists()
        names = {row["name"] for row in _api(again, "/api/v1/queues")}
        # configured: the file's queue is created again at the start, empty
        assert "doomed" in names
        row = _api(again, "/api/v1/queues/doomed")
        assert (row["messages"], row["paged_messages"], row["paged_bytes"]) == (0, 0, 0)
    finally:
        again.stop()


def test_a_management_address_purge_of_a_paged_queue_lets_another_queue_be_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-160 over B-151: removeMessages with a filter, sent to the management address by a
    real AMQP client, walks the paged queue a slice per loop turn and answers the count
    at the end; a client of another queue is served between the slices (before: every
    page file read in the request's loop turn)."""
    monkeypatch.setattr(ops, "SLICE_MESSAGES", 40)
    broker = start_in_thread(tmp_path, CONFIG)
    try:
        core = broker.server.broker
        colour = lambda i: {"colour": "blue" if i % 2 else "red"}  # noqa: E731
        assert bulk.send(broker.url, "doomed", range(N), size=1024, properties=colour) == N
        assert broker.call(lambda: core.queues["doomed"].pages.messages) > N // 2
        served_then: list[int] = []
        real_slice = ops._slice

        def recording_slice(b: Any, walk: Any) -> bool:
            served_then.append(core.queues["other"].counters.added)
            return real_slice(b, walk)

        monkeypatch.setattr(ops, "_slice", recording_slice)
        client = _RoundTrips(broker.url)
        client.start()
        try:
            wait_until(lambda: client.done >= 5 or client.error, timeout=60)
            removed = _manage(
                broker.url, "removeMessages", "colour = 'blue'", resource="queue.doomed"
            )
        finally:
            client.stop.set()
            client.join(timeout=60)
        assert client.error is None, client.error
        assert removed == N // 2
        assert len(served_then) >= N // 40
        assert served_then[-1] > served_then[0], "nothing else was served during the walk"
        assert _api(broker, "/api/v1/queues/doomed")["messages"] == N // 2
    finally:
        broker.stop()
