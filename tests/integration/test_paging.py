"""B-151 PAGE with the real broker (issue 23 item 2): a backlog ten times global-max-size
stays out of memory, drains in order, survives SIGKILL and restarts.

Sizes are kept small so that `make test` stays fast (2 MiB limit, 20 MiB backlog);
`PAGING_SCALE=10 make test-paging-long` runs them ten times larger.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import bulk
from support.client import connect, is_empty
from support.inproc import ThreadBroker
from support.process import BrokerProcess, start_broker
from support.waiting import wait_until

SCALE = int(os.environ.get("PAGING_SCALE", "1"))
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180 * SCALE)]
LIMIT = 2 * 1024 * 1024  # global-max-size
N = 20_000 * SCALE  # 1 KiB messages: ten times the limit
SIZE = 1024


def _config(*, persistence: bool, expiry: bool = False) -> str:
    """`expiry`: expired messages go to ExpiryQueue (EXP.q), scanned every 500 ms."""
    expiry_settings = ", expiry-address: ExpiryQueue, auto-create-expiry-resources: true"
    return f"""
        global-max-size: {LIMIT}
        message-expiry-scan-period: 500
        persistence:
          enabled: {"true" if persistence else "false"}
        address-settings:
          "#": {{page-size-bytes: 1048576, max-read-page-bytes: 1048576
                 {expiry_settings if expiry else ""}}}
        addresses:
          - name: q
            anycast: [{{name: q}}]
          - name: ExpiryQueue
            anycast: [{{name: ExpiryQueue}}]
        """


def _api(broker: BrokerProcess | ThreadBroker, path: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _metric(broker: BrokerProcess | ThreadBroker, name: str) -> float:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + '{address="q"}'):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for q")


def test_a_backlog_ten_times_global_max_size_stays_on_disk_and_drains_in_order(
    tmp_path: Path,
) -> None:
    """B-151 PAGE: no consumer, 10 x global-max-size sent: RSS grows by far less than
    the backlog, the API and metrics show it paging; then a consumer gets every message
    in order, none lost or duplicated."""
    broker = start_broker(tmp_path, _config(persistence=False), log_level="info")
    try:
        before = broker.rss_bytes()
        assert bulk.send(broker.url, "q", range(N), size=SIZE, durable=lambda i: False) == N
        grown = broker.rss_bytes() - before
        assert grown < LIMIT + 8 * 1024 * 1024, f"RSS grew by {grown}"  # backlog: 20 MiB
        row = _api(broker, "/api/v1/queues/q")
        assert row["messages"] == N
        assert row["paging"] is True
        assert row["paged_messages"] > N * 8 // 10
        assert _metric(broker, "amqpbroker_address_paged_messages") == row["paged_messages"]
        assert _metric(broker, "amqpbroker_address_paged_bytes") == row["paged_bytes"]
        assert row["paged_bytes"] >= row["paged_messages"] * SIZE
        assert _metric(broker, "amqpbroker_address_page_files") > 5
        assert bulk.receive(broker.url, "q", N) == list(range(N))
        assert _api(broker, "/api/v1/queues/q")["messages"] == 0
        assert _metric(broker, "amqpbroker_address_page_files") <= 1
    finally:
        broker.stop()


def test_a_browser_sees_a_paged_backlog_in_order_and_a_consumer_then_gets_it_all(
    tmp_path: Path,
) -> None:
    """B-031 over B-151 PAGE (issue 23: browse behaves the same for paged messages): a
    proton browser (distribution-mode copy) of a queue ten times global-max-size sees
    all N messages in order, paged ones included, without the broker holding them; the
    queue still has N, and a consumer then gets all N in order."""
    broker = start_broker(tmp_path, _config(persistence=False), log_level="info")
    try:
        assert bulk.send(broker.url, "q", range(N), size=SIZE, durable=lambda i: False) == N
        before = broker.rss_bytes()
        assert bulk.browse(broker.url, "q", N) == list(range(N))
        grown = broker.rss_bytes() - before
        assert grown < LIMIT + 8 * 1024 * 1024, f"RSS grew by {grown}"  # backlog: 20 MiB
        row = _api(broker, "/api/v1/queues/q")
        assert row["messages"] == N
        assert row["paged_messages"] > N * 8 // 10
        assert bulk.receive(broker.url, "q", N) == list(range(N))
        assert _api(broker, "/api/v1/queues/q")["messages"] == 0
    finally:
        broker.stop()


def test_a_paged_backlog_that_expires_goes_to_the_expiry_address_without_a_consumer(
    broker_in_thread: Callable[[str], ThreadBroker],
) -> None:
    """B-084/B-085/B-090 over B-151 PAGE (issue 23: a paged message that expires is moved
    to the expiry address without being delivered): no consumer, a backlog ten times
    global-max-size with a TTL; once the clock passes it and an expiry scan, the queue is
    empty (API and metrics), every message is in the expiry queue with the x-opt-ORIG-*
    annotations, and a consumer of the queue gets nothing."""
    broker = broker_in_thread(_config(persistence=False, expiry=True))
    assert bulk.send(broker.url, "q", range(N), size=SIZE, durable=lambda i: False, ttl_s=5) == N
    assert _api(broker, "/api/v1/queues/q")["paged_messages"] > N * 8 // 10
    broker.advance_clock(5_000)  # past the TTL and a scan: read back a step a loop turn
    wait_until(lambda: _api(broker, "/api/v1/queues/q")["messages"] == 0, timeout=60 * SCALE)
    row = _api(broker, "/api/v1/queues/q")
    assert (row["expired"], row["paged_messages"]) == (N, 0)
    assert _metric(broker, "amqpbroker_address_paged_messages") == 0
    assert _api(broker, "/api/v1/queues/EXP.q")["messages"] == N
    conn = connect(broker.url)
    try:
        moved = conn.create_receiver("ExpiryQueue::EXP.q").receive(timeout=5)
        assert moved.annotations["x-opt-ORIG-ADDRESS"] == "q"
        assert moved.annotations["x-opt-ORIG-QUEUE"] == "q"
        assert moved.annotations["x-opt-ACTUAL-EXPIRY"] == broker.clock.now_ms()
        assert is_empty(conn, "q")
    finally:
        conn.close()


def test_durable_paged_messages_that_expired_stay_expired_after_a_restart(
    tmp_path: Path,
) -> None:
    """B-084/B-085 + B-095 over B-151 PAGE: a durable paged backlog whose TTL passes with
    no consumer moves to the expiry queue as it is read back (the page cursor and the
    copies journaled together); after a restart the queue is still empty and the
    expiry queue holds every message once."""
    config = _config(persistence=True, expiry=True)
    n = N // 4
    broker = start_broker(tmp_path, config, log_level="info")
    try:
        assert bulk.send(broker.url, "q", range(n), size=SIZE, ttl_s=2) == n
        wait_until(lambda: _api(broker, "/api/v1/queues/q")["messages"] == 0, timeout=60 * SCALE)
        assert _api(broker, "/api/v1/queues/EXP.q")["messages"] == n
    finally:
        broker.stop()
    broker = start_broker(tmp_path, config, log_level="info")
    try:
        row = _api(broker, "/api/v1/queues/q")
        assert (row["messages"], row["paged_messages"]) == (0, 0)
        assert _api(broker, "/api/v1/queues/EXP.q")["messages"] == n
    finally:
        broker.stop()


def test_a_paged_backlog_comes_back_after_a_restart_without_its_non_durable_part(
    tmp_path: Path,
) -> None:
    """B-151 PAGE + B-095: after a clean restart the durable paged messages are all there
    (not loaded into memory), the non-durable ones are not (as Artemis); order kept."""
    broker = start_broker(tmp_path, _config(persistence=True), log_level="info")
    durable = lambda i: i % 4 != 3  # noqa: E731
    try:
        assert bulk.send(broker.url, "q", range(N), size=SIZE, durable=durable) == N
    finally:
        broker.stop()
    broker = start_broker(tmp_path, _config(persistence=True), log_level="info")
    try:
        assert broker.rss_bytes() < 3 * LIMIT + 80 * 1024 * 1024  # not the 20 MiB backlog
        # nor at any moment of the recovery (the peak, VmHWM: issue 23 audit)
        assert broker.peak_rss_bytes() < 3 * LIMIT + 80 * 1024 * 1024
        kept = [i for i in range(N) if durable(i)]
        row = _api(broker, "/api/v1/queues/q")
        in_memory = row["messages"] - row["paged_messages"]
        # What was in memory at the stop is journaled whole (non-durable ones die there).
        assert len(kept) <= row["messages"] <= len(kept) + in_memory
        got = bulk.receive(broker.url, "q", row["messages"])
        assert [i for i in got if durable(i)] == kept
    finally:
        broker.stop()


def test_sigkill_while_producing_loses_no_accepted_paged_message(tmp_path: Path) -> None:
    """B-151 PAGE + B-095: SIGKILL halfway through a durable backlog; after a restart
    every accepted message is there, in order, none twice."""
    broker = start_broker(tmp_path, _config(persistence=True), log_level="info")

    def kill_halfway(accepted: int) -> None:
        if accepted == N // 2:
            broker.kill()

    accepted = bulk.send(broker.url, "q", range(N), size=SIZE, on_accepted=kill_halfway)
    assert accepted >= N // 2
    broker = start_broker(tmp_path, _config(persistence=True), log_level="info")
    try:
        held = _api(broker, "/api/v1/queues/q")["messages"]
        assert held >= accepted
        assert bulk.receive(broker.url, "q", held) == list(range(held))
    finally:
        broker.stop()


def test_sigkill_while_draining_loses_nothing_and_repeats_only_unacknowledged(
    tmp_path: Path,
) -> None:
    """B-151 PAGE + B-095: SIGKILL halfway through draining a durable paged backlog; after
    a restart the rest is there in order (at-least-once: only a tail of messages whose
    acknowledgement may not have been stored comes again)."""
    broker = start_broker(tmp_path, _config(persistence=True), log_level="info")
    assert bulk.send(broker.url, "q", range(N), size=SIZE) == N

    def kill_halfway(received: int) -> None:
        if received == N // 2:
            broker.kill()

    first = bulk.receive(broker.url, "q", N, on_message=kill_halfway)
    assert first == list(range(len(first)))
    broker = start_broker(tmp_path, _config(persistence=True), log_level="info")
    try:
        wait_until(lambda: _api(broker, "/api/v1/queues/q")["messages"] > 0, timeout=10)
        held = _api(broker, "/api/v1/queues/q")["messages"]
        rest = bulk.receive(broker.url, "q", held)
        start = N - held
        assert rest == list(range(start, N))
        assert N // 2 - 2_000 <= start <= len(first)  # repeated: at most one prefetch
    finally:
        broker.stop()


def test_a_journal_backlog_larger_than_global_max_size_restarts_bounded_and_drains(
    tmp_path: Path,
) -> None:
    """Issue 23 "memory bounded during recovery" (B-151, B-095): a durable backlog that
    went to the journal (under a 1 GiB limit) is restarted with an 8 MiB global-max-size:
    about the limit comes into memory; the rest stays in the journal (its index and ~48
    bytes a message are what it costs, not its body) and comes back as the queue drains,
    in order, none lost or duplicated; the acks are journaled. 4 KiB messages: the
    per-message index (~0.9 KiB) is then well apart from the body. `PAGING_SCALE=10`
    (`make test-paging-long`): 400 MiB behind the same 8 MiB."""
    limit = 8 * 1024 * 1024
    size = 4096
    n = 10_000 * SCALE  # ~40 MiB (x SCALE)

    def config(global_max_size: int) -> str:
        return _config(persistence=True).replace(
            f"global-max-size: {LIMIT}", f"global-max-size: {global_max_size}"
        )

    broker = start_broker(tmp_path, config(1024 * 1024 * 1024), log_level="info")
    try:
        assert bulk.send(broker.url, "q", range(n), size=size) == n
        assert _api(broker, "/api/v1/queues/q")["paged_messages"] == 0  # all journaled
    finally:
        broker.stop()
    broker = start_broker(tmp_path, config(limit), log_level="info")
    try:
        # Measured at 40 MiB: 66 MiB after the restart, 98 MiB with every message in
        # memory (before this pass); the idle broker is ~48 MiB.
        rss = broker.rss_bytes()
        assert rss < 64 * 1024 * 1024 + 2 * limit + n * 1024, f"RSS {rss}"
        # The peak adds the open's mapped segment (at most one, 64 MiB) and its index.
        peak = broker.peak_rss_bytes()
        assert peak < 128 * 1024 * 1024 + 2 * limit + n * 2048, f"peak RSS {peak}"
        row = _api(broker, "/api/v1/queues/q")
        assert row["messages"] == n
        assert row["paged_messages"] > n * 3 // 4  # left in the journal, counted as paged
        assert bulk.receive(broker.url, "q", n) == list(range(n))
        assert _api(broker, "/api/v1/queues/q")["messages"] == 0
    finally:
        broker.stop()
    broker = start_broker(tmp_path, config(limit), log_level="info")
    try:
        assert _api(broker, "/api/v1/queues/q")["messages"] == 0  # the acks were journaled
    finally:
        broker.stop()
