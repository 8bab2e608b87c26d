"""Issue 23 item 3: memory that a purge, a drain or a dropped (aborted or oversized)
transfer frees goes back to the system in bounded time (glibc keeps freed message
buffers in the heap; the broker calls malloc_trim, `store/sysmem.MemoryReturner`)."""

from __future__ import annotations

import gc
import json
import os
import urllib.request
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Link, Session
from proton import Message as ProtonMessage
from support import bulk
from support.client import connect
from support.http import get_json
from support.inproc import ThreadBroker
from support.process import BrokerProcess, start_broker
from support.raw import RawClient, open_socket
from support.waiting import wait_until

SCALE = int(os.environ.get("PAGING_SCALE", "1"))
# 11-29 s each on the quiet CI machine; the purge test's 50,000 sends passed 120 s at
# load ~10 on two cores (a broker and a client, each given a fraction of a core).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300 * SCALE)]

# How long RSS may take to come back after a drain or a dropped transfer: the server's
# one-second checks (two in a row for the settled rule), a collection at most every 10 s,
# and their `malloc_trim` over ~100 MB of heap, at a fraction of a core: 5 and 10 s passed
# quiet but timed out at load 8-10. Memory that never comes back (the bug these tests are
# for: 40 -> 116 MB for good) still fails; a wait that is met returns at once. The purge
# does not wait: its trim is done before it answers.
RETURN_SECONDS = 30.0

# One queue, and a global-max-size far above the backlog: everything stays in memory.
HELD_IN_MEMORY = """
global-max-size: 1073741824
addresses:
  - name: q
    anycast: [{name: q}]
"""
N = 50_000 * SCALE  # 1 KiB messages held in memory (global-max-size is far above)


def test_rss_comes_back_after_a_purge_of_a_large_backlog(tmp_path: Path) -> None:
    """A 50 MiB in-memory backlog raises RSS by more than its size; when a purge over
    HTTP answers, RSS is back within 16 MiB of where it started (issue 23)."""
    broker = start_broker(
        tmp_path,
        HELD_IN_MEMORY,
        log_level="info",
    )
    try:
        before = broker.rss_bytes()
        assert bulk.send(broker.url, "q", range(N), size=1024, durable=lambda i: False) == N
        peak = broker.rss_bytes()
        assert peak - before > N * 1024  # held in memory: ~1.5x the bodies
        request = urllib.request.Request(
            f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/q/purge",
            data=b"{}",
            method="POST",
            headers={"X-Requested-By": "test", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["removed"] == N
        # No wait: the trim runs when the walk has ended, before the reply is sent, and
        # no earlier trim can take the purge's drop with it (a periodic check between
        # the slice that killed the last message and the one that freed them did: RSS
        # stayed at its peak for good at load ~20; `MemoryReturner`'s ended rule).
        after = broker.rss_bytes()
        assert after - before < 16 * 1024 * 1024, f"RSS {before} -> {peak} -> {after}"
    finally:
        broker.stop()


def test_rss_comes_back_after_a_drain_of_a_large_backlog(tmp_path: Path) -> None:
    """Issue 23 ("memory that a purge, a drain ... frees comes back to the system within
    a bounded time"), the drain: a consumer takes a 25 MiB in-memory backlog; within
    seconds RSS is back within 8 MiB of where it was (the server's engine timer calls
    the returner, not only a management command; once the drain stops, what it freed
    below the returner's threshold goes back too, and once little is queued the
    consumer's closed connection is collected). Measured with 50 MiB before the
    collection: 52 MB before, 120 MB at the peak, 73 MB after; 300k drained: 42.5 ->
    491.6 -> 60.3 MiB, 44.8 after a collection."""
    broker = start_broker(
        tmp_path,
        HELD_IN_MEMORY,
        log_level="info",
    )
    try:
        assert bulk.send(broker.url, "q", range(1_000), size=1024, durable=lambda i: False)
        assert len(bulk.receive(broker.url, "q", 1_000)) == 1_000  # warm: code, buffers
        before = broker.rss_bytes()
        n = N // 2  # a drain is slower than a purge: half the backlog keeps it quick
        assert bulk.send(broker.url, "q", range(n), size=1024, durable=lambda i: False) == n
        peak = broker.rss_bytes()
        assert peak - before > n * 1024  # held in memory: ~1.4x the bodies
        assert bulk.receive(broker.url, "q", n) == list(range(n))
        wait_until(  # two checks a second apart, and a collection at most every 10 s
            lambda: broker.rss_bytes() - before < 8 * 1024 * 1024,
            timeout=RETURN_SECONDS,
            message=f"RSS back near {before} (peak {peak}, now {broker.rss_bytes()})",
        )
    finally:
        broker.stop()


# An acceptor with a max-message-size well above the mmap threshold glibc settles on
# (32 MiB at most): the refused parts are buffered in the heap, not in their own maps.
OVERSIZED = """
global-max-size: 1073741824
acceptors:
  - name: amqp
    url: amqp://127.0.0.1:0
    max-message-size: 16777216
addresses:
  - name: q
    anycast: [{name: q}]
"""
CHUNK = 1024 * 1024


def _session(client: RawClient) -> Session:
    """Open the connection (SASL ANONYMOUS) and a session."""
    client.transport.sasl().allowed_mechs("ANONYMOUS")
    client.connection.open()
    session = client.connection.session()
    session.open()
    return session


def _sender(client: RawClient, session: Session, name: str) -> Link:
    """A sender to `q`, once the broker has given it credit."""
    sender = session.sender(name)
    sender.target.address = "q"
    sender.open()
    client.pump(lambda: sender.credit > 0)
    return sender


def _stream(client: RawClient, sender: Link, tag: str, size: int, *, until_refused: bool) -> Any:
    """Send `size` bytes of one message in CHUNK frames, pumping as it goes; with
    `until_refused`, stop once the broker has detached the link."""
    delivery = sender.delivery(tag)
    sent = 0
    while sent < size:
        if until_refused and sender.remote_condition is not None:
            break
        sender.stream(b"x" * min(CHUNK, size - sent))
        sent += CHUNK
        client.pump(lambda: client.transport.pending() <= 0, timeout=30)
    return delivery


def _settle_one(client: RawClient, sender: Link, tag: str) -> None:
    """A small message after the large one: once it is accepted, the broker has read
    every frame before it (the large one's abort included)."""
    delivery = sender.delivery(tag)
    sender.send(bytes(ProtonMessage(body=b"small").encode()))
    sender.advance()
    client.pump(lambda: delivery.remote_state == Delivery.ACCEPTED, timeout=30)


def test_rss_comes_back_after_aborted_and_oversized_transfers(tmp_path: Path) -> None:
    """Issue 23 ("memory that ... an aborted oversized transfer frees comes back"):
    multi-frame transfers the broker buffers and then drops, aborted by the client
    (`aborted=true`, within max-message-size) and refused past the acceptor's
    max-message-size (B-152: the link detached with message-size-exceeded). RSS rises
    while they arrive (the engine buffers a delivery until its last frame, and keeps the
    buffers for the connection's next deliveries); once the connection has closed, it is
    back near where it was within seconds, each time. Before the fix: 40 -> 65 -> 90 ->
    116 MB over three such connections, never back (the engine's buffers went only with
    the collector's rare full collection)."""
    broker = start_broker(tmp_path, OVERSIZED, log_level="info")
    try:
        before = 0
        for c in range(2):
            before, peak = _drop_large_transfers(broker, before, c)
            wait_until(  # (the server checks every second; collects at most every 10 s)
                lambda before=before: broker.rss_bytes() - before < 8 * 1024 * 1024,  # type: ignore[misc]
                timeout=RETURN_SECONDS,
                message=f"RSS back near {before} (peak {peak}, now {broker.rss_bytes()})",
            )
        # Only the small messages were queued: nothing of the dropped ones got through.
        assert get_json(broker.ports["http"], "/api/v1/queues/q")["messages"] == 4
    finally:
        broker.stop()


def _drop_large_transfers(broker: BrokerProcess, before: int, c: int) -> tuple[int, int]:
    """One connection: a 12 MiB transfer aborted, a 20 MiB one refused at 16 MiB, each
    after a small accepted one; closed. RSS before (the first connection's, after its
    small message: the code of a send loaded) and at the peak."""
    client = RawClient(open_socket(broker.ports["amqp"]))
    try:
        session = _session(client)
        sender = _sender(client, session, f"warm-{c}")
        _settle_one(client, sender, f"w{c}")
        before = before or broker.rss_bytes()
        sender = _sender(client, session, f"aborted-{c}")
        delivery = _stream(client, sender, f"a{c}", 12 * 1024 * 1024, until_refused=False)
        delivery.abort()
        _settle_one(client, sender, f"s{c}")
        refused = _sender(client, session, f"oversized-{c}")
        _stream(client, refused, f"o{c}", 20 * 1024 * 1024, until_refused=True)
        client.pump(lambda: refused.remote_condition is not None, timeout=30)
        assert refused.remote_condition.name == "amqp:link:message-size-exceeded"
        peak = broker.rss_bytes()
        assert peak - before > 10 * 1024 * 1024  # the parts were buffered
        return before, peak
    finally:
        client.close()


def test_closed_connections_are_freed_without_the_cyclic_collector(
    broker_in_thread: Callable[[str], ThreadBroker],
) -> None:
    """Issue 23, B-053/B-054: connections that attached, sent and took deliveries they
    never settled, then closed (an AMQP close) or vanished (the socket closed), are freed
    by reference counting once their sockets are gone: with the cyclic collector off, no
    broker-side connection is left alive, and the unsettled messages are back."""
    broker = broker_in_thread(HELD_IN_MEMORY)
    server = broker.server
    clients = [connect(broker.url, container=f"c{i}") for i in range(3)]
    for client in clients:
        sender = client.create_sender("q")
        for n in range(10):
            sender.send(ProtonMessage(body=f"m{n}"))
    raws = [RawClient(open_socket(broker.ports["amqp"])) for _ in range(3)]
    for n, raw in enumerate(raws):
        link = raw.anonymous_receiver(f"r{n}", "q", credit=2)
        raw.pump(lambda link=link: link.queued > 0)  # type: ignore[misc]
    for client in clients:
        receiver = client.create_receiver("q", credit=2)
        receiver.receive(timeout=5)  # delivered, never settled
    connections = broker.call(
        lambda: [weakref.ref(amqp) for amqp in server.shell.connections.values()]
    )
    assert len(connections) == 6
    gc.collect()
    gc.disable()
    try:
        for client in clients:
            client.close()  # an AMQP close: orderly
        for raw in raws:
            raw.close()  # no close frame: the socket just goes
        wait_until(lambda: broker.call(lambda: not server.shell.connections), timeout=10)
        alive = broker.call(lambda: sum(ref() is not None for ref in connections))
    finally:
        gc.enable()
    assert alive == 0
    assert broker.call(lambda: server.broker.queues["q"].message_count) == 30
