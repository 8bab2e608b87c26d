"""Damaged page files under the management API (issue 23 attack; B-151, B-161): an
operator's purge or move with ids over a queue with a damaged page file answers 200 and
takes each message once; the broker goes on paging and delivering."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import bulk
from support.client import QUEUE, connect, drain_round
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONFIG = """
global-max-size: 1048576
address-settings:
  "#": {page-size-bytes: 262144, max-read-page-bytes: 262144, management-browse-page-size: 3000}
addresses:
  - name: q
    anycast: [{name: q}]
  - name: other
    anycast: [{name: other}]
"""
N = 3_000


def _numbers(broker: BrokerProcess, address: str) -> list[int]:
    """Accept everything `address` holds (rounds of credit drain): the bulk numbers."""
    conn = connect(broker.url)
    got: list[int] = []
    try:
        receiver = conn.create_receiver(address, options=QUEUE)
        while True:
            batch = drain_round(conn, receiver, 100)
            for message in batch:
                got.append(int(bytes(message.body[:8])))
                receiver.accept()
            if len(batch) < 100:
                return got
    finally:
        conn.close()


def _call(broker: BrokerProcess, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"X-Requested-By": "test"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("endpoint", ["purge", "move"])
def test_purge_or_move_by_ids_over_a_damaged_page_file_answers_and_takes_once(
    tmp_path: Path, endpoint: str
) -> None:
    broker = start_broker(tmp_path, CONFIG, log_level="info")
    try:
        assert bulk.send(broker.url, "q", range(N), size=1024, durable=lambda i: False) == N
        listed = _call(broker, f"/api/v1/queues/q/messages?limit={N}")
        ids = [m["msg_id"] for m in listed]
        assert len(ids) == N
        paths = sorted((broker.data_dir / "paging").rglob("*.page"))
        assert len(paths) > 4
        paths[-2].write_bytes(b"\xff" * paths[-2].stat().st_size)  # the whole file garbage
        doomed = ids[-1500:-1400]  # paged, in a file before the damaged one
        body: dict[str, Any] = {"ids": doomed}
        if endpoint == "move":
            body["to-queue"] = "other"
        reply = _call(broker, f"/api/v1/queues/q/{endpoint}", body)
        assert reply == {"removed" if endpoint == "purge" else "moved": len(doomed)}
        got = _numbers(broker, "q")
        assert N - len(doomed) - 300 < len(got) < N - len(doomed)  # the damaged file's lost
        assert not set(got) & set(range(N - 1500, N - 1400))  # never twice
        assert len(set(got)) == len(got)
        assert bulk.send(broker.url, "q", range(N, N + 100), size=1024) == 100
        assert bulk.receive(broker.url, "q", 100) == list(range(N, N + 100))
        if endpoint == "move":
            moved = _numbers(broker, "other")
            assert moved == list(range(N - 1500, N - 1400))
    finally:
        broker.stop()


def _metric(broker: BrokerProcess, name: str, address: str) -> float:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'{name}{{address="{address}"}} '):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {address}")


def test_paged_messages_lost_to_a_damaged_page_file_show_in_metrics_and_the_api(
    tmp_path: Path,
) -> None:
    """B-151 (issue 23 fix 3): the paged messages a damaged page file loses were counted
    only inside the page store (`lost`), seen nowhere. Now the queue view has
    `paged_lost` next to the paged counts and /metrics the per-address counter
    `amqpbroker_address_paged_messages_lost_total`; what a consumer got plus what is lost
    is everything sent."""
    broker = start_broker(tmp_path, CONFIG, log_level="info")
    try:
        assert bulk.send(broker.url, "q", range(N), size=1024, durable=lambda i: False) == N
        name = "amqpbroker_address_paged_messages_lost_total"
        assert _metric(broker, name, "q") == 0
        assert _call(broker, "/api/v1/queues/q")["paged_lost"] == 0
        paths = sorted((broker.data_dir / "paging").rglob("*.page"))
        assert len(paths) > 4
        paths[-2].write_bytes(b"\xff" * paths[-2].stat().st_size)
        got = _numbers(broker, "q")
        row = _call(broker, "/api/v1/queues/q")
        assert 0 < row["paged_lost"] < 300
        assert len(got) + row["paged_lost"] == N
        assert (row["messages"], row["paged_messages"]) == (0, 0)
        assert _metric(broker, name, "q") == row["paged_lost"]
    finally:
        broker.stop()


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_restart_after_a_damaged_page_file_was_skipped_redelivers_and_counts_nothing(
    tmp_path: Path, where: str
) -> None:
    """B-151 + B-095 (issue 23 fix 4): a durable queue's read back that skipped an
    unreadable page file (a directory in its place: an I/O error) and found nothing after
    it did not journal its cursor, and a restart then failed on the file the broker had
    already counted as lost; with a cursor journaled past it, the start failed deleting
    it. Now the cursor is journaled as the skip moves it, the start passes the file
    (logged), and after the restart nothing is delivered again nor counted lost twice."""
    config = CONFIG + "persistence: {enabled: true}\n"
    broker = start_broker(tmp_path, config, log_level="info")
    try:
        n = 1_100 if where == "last" else 1_700  # paged: one file, or three and a bit
        assert bulk.send(broker.url, "q", range(n), size=1024) == n
        paths = sorted((broker.data_dir / "paging").rglob("*.page"))
        assert len(paths) == 1 if where == "last" else len(paths) >= 3
        doomed = paths[-1] if where == "last" else paths[1]
        doomed.unlink()
        doomed.mkdir()
        got = _numbers(broker, "q")
        lost = _call(broker, "/api/v1/queues/q")["paged_lost"]
        assert lost > 0
        assert len(got) + lost == n
        assert bulk.send(broker.url, "q", range(n, n + 50), size=1024) == 50
        assert _numbers(broker, "q") == list(range(n, n + 50))
    finally:
        broker.stop()
    broker = start_broker(tmp_path, config, log_level="info")  # failed: "cannot start"
    try:
        row = _call(broker, "/api/v1/queues/q")
        assert (row["messages"], row["paged_messages"], row["paged_lost"]) == (0, 0, 0)
        assert _numbers(broker, "q") == []  # none of the consumed ones again
        assert bulk.send(broker.url, "q", range(50), size=1024) == 50
        assert _numbers(broker, "q") == list(range(50))
    finally:
        broker.stop()
