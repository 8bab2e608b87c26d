"""Out of file descriptors (issue 15 item 1): idle sockets take every descriptor the
broker may have while its journal has to roll segments.

The broker runs under a wrapper that sets RLIMIT_NOFILE (soft and hard) low and gives
the journal small segments, so that a few durable sends roll one. Idle TCP connections
fill its descriptor table; durable sends meanwhile may pass or be refused; once the
sockets close, durable sends pass again on the same connection, without a restart, and
every accepted message survives one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import Message
from proton.utils import SendException
from support.client import QUEUE, connect, drain
from support.process import BrokerProcess
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CONFIG = "persistence:\n  enabled: true\n"
LIMIT = 48  # descriptors; the broker needs about a dozen of them to run
SEGMENT_BYTES = 4096  # a 1 KiB durable message or so rolls a segment every few sends


def _wrapper(*, reserve: bool) -> str:
    """`python -c` source running `amqpbroker` (its arguments after two of the wrapper's:
    RLIMIT_NOFILE, soft and hard, and the journal's segment bytes). Without `reserve`
    sockets may take every descriptor (FD_RESERVE 0): the journal's own recovery."""
    no_reserve = "" if reserve else "server.FD_RESERVE = 0\n"
    return f"""
import resource, runpy, sys
limit, segment_bytes = int(sys.argv.pop(1)), int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
import amqpbroker.server as server
from amqpbroker.store.journal import FileJournal
class SmallSegments(FileJournal):
    def __init__(self, *args, **kw):
        kw["max_segment_bytes"] = segment_bytes
        super().__init__(*args, **kw)
server.FileJournal = SmallSegments
{no_reserve}sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


INJECT = _wrapper(reserve=False)


def _descriptors(broker: BrokerProcess) -> int:
    return len(os.listdir(f"/proc/{broker.proc.pid}/fd"))


def _journal_failed(broker: BrokerProcess) -> float:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("amqpbroker_journal_failed "):
                return float(line.split(" ")[1])
    raise AssertionError("no amqpbroker_journal_failed in /metrics")


def test_durable_sends_pass_again_once_idle_sockets_give_descriptors_back(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """Issue 15 item 1 (B-095): descriptor exhaustion does not break durable storage
    for good. The journal's spare segment takes a roll with no descriptor left; a later
    roll may fail, and then the journal retries until descriptors come back."""
    broker = spawn(tmp_path, CONFIG, python=("-c", INJECT, str(LIMIT), str(SEGMENT_BYTES)))
    conn = connect(broker.url)
    sender = conn.create_sender("fds", options=QUEUE)
    accepted = ["before"]
    sender.send(Message(body="before", durable=True))
    idle: list[socket.socket] = []
    try:
        for _ in range(LIMIT):  # more than it can take: the rest wait in the backlog
            idle.append(socket.create_connection(("127.0.0.1", broker.ports["amqp"]), 5))
        wait_until(lambda: _descriptors(broker) >= LIMIT, timeout=10, message="fd table full")
        refused = 0
        for i in range(12):  # several segment rolls with no descriptor to spare
            body = f"exhausted-{i}-" + "x" * 1000
            try:
                sender.send(Message(body=body, durable=True))
                accepted.append(body)
            except SendException:
                refused += 1
    finally:
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.close()
    wait_until(lambda: _descriptors(broker) < LIMIT // 2, timeout=10, message="sockets closed")
    wait_until(lambda: _journal_failed(broker) == 0, timeout=20, message="journal resumed")
    sender.send(Message(body="after", durable=True))  # no restart needed
    accepted.append("after")
    conn.close()
    assert broker.stop() == 0, broker.log()
    broker = spawn(tmp_path, CONFIG)
    try:
        assert [body for body, _ in drain(broker.url, "fds")] == accepted
    finally:
        assert broker.stop() == 0, broker.log()


# The reserve as shipped (FD_RESERVE): only the limit and the segments are small.
RESERVE_INJECT = _wrapper(reserve=True)
RESERVE_LIMIT = 400  # the reserve is min(128, 400 // 4) = 100: AMQP stops at fd 300
UNLIMITED_HANDSHAKES = """
acceptors:
  - name: amqp
    url: amqp://127.0.0.1:0
    handshakes-per-source: -1
persistence:
  enabled: true
"""


def test_idle_http_connections_leave_the_journal_its_descriptors(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """h-loose: the AMQP acceptors keep a reserve of descriptors for the broker's files,
    but the HTTP server accepted up to http.max-connections (100) idle connections past
    it: with the AMQP side at its line, an HTTP flood left 1 descriptor of 400 (a page
    file, an event-log file or a journal segment could not be opened). HTTP now stops
    at half the reserve (the files' half stays free); durable sends rolling segments
    pass during the flood, and once idle AMQP sockets go a new AMQP connection is
    served while the HTTP flood goes on."""
    broker = spawn(
        tmp_path,
        UNLIMITED_HANDSHAKES,
        python=("-c", RESERVE_INJECT, str(RESERVE_LIMIT), str(SEGMENT_BYTES)),
    )
    conn = connect(broker.url)
    sender = conn.create_sender("reserve", options=QUEUE)
    sender.send(Message(body="before", durable=True))
    idle_amqp: list[socket.socket] = []
    idle_http: list[socket.socket] = []
    try:
        for _ in range(RESERVE_LIMIT - 80):  # past the AMQP line: the rest are refused
            idle_amqp.append(socket.create_connection(("127.0.0.1", broker.ports["amqp"]), 5))
        wait_until(lambda: _descriptors(broker) >= 295, timeout=10, message="AMQP at its line")
        for _ in range(150):  # more than http.max-connections, all idle
            idle_http.append(socket.create_connection(("127.0.0.1", broker.ports["http"]), 5))
        for sock in idle_http:  # each was served (held) or answered 503 and closed
            sock.setblocking(False)
        wait_until(lambda: _descriptors(broker) >= 340, timeout=10, message="HTTP took what it may")
        assert _descriptors(broker) <= RESERVE_LIMIT - 50 + 2  # the files' half is free
        for i in range(40):  # ten segment rolls during the flood: all stored
            sender.send(Message(body=f"flood-{i}-" + "x" * 1000, durable=True))
        for sock in idle_amqp:
            sock.close()
        idle_amqp.clear()
        wait_until(lambda: _descriptors(broker) < 250, timeout=15, message="AMQP sockets gone")
        other = connect(broker.url)  # AMQP is served while the HTTP flood goes on
        other.create_sender("reserve", options=QUEUE).send(Message(body="new", durable=True))
        other.close()
    finally:
        for sock in idle_amqp + idle_http:
            with contextlib.suppress(OSError):
                sock.close()
    conn.close()
    assert "the descriptors left are the journal's" in broker.log()
    assert broker.stop() == 0, broker.log()
