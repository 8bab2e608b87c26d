"""Management on big queues through the real broker (B-161, B-160; issue: management on
big queues blocks the loop): by-id operations through the queue's id index and browse
pages read lazily give the answers a walk of the whole queue gave, over HTTP (the AMQP
management address: test_management_address.py), with priorities and paged (B-151)
messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.client import QUEUE
from support.http import raw_request
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_CONFIG = """
address-settings:
  "pg.#": {max-size-messages: 5, address-full-policy: PAGE}
"""


def http(broker: BrokerProcess, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One API request (POST with a JSON body, else GET): status and decoded JSON."""
    status, _, raw = raw_request(
        broker.ports["http"],
        "GET" if body is None else "POST",
        path,
        headers={"X-Requested-By": "test", "Content-Type": "application/json"},
        body=b"" if body is None else json.dumps(body).encode(),
    )
    return status, json.loads(raw)


def _fill(conn: BlockingConnection, queue: str, n: int) -> None:
    sender = conn.create_sender(queue, options=QUEUE)
    for i in range(n):
        sender.send(Message(body=f"m{i}", priority=i % 3 + 3, properties={"n": i}))
    sender.close()


def _listed(broker: BrokerProcess, queue: str) -> list[int]:
    status, rows = http(broker, f"/api/v1/queues/{queue}/messages?limit=1000")
    assert status == 200
    return [row["msg_id"] for row in rows]


def test_http_pages_and_by_id_operations_match_the_whole_queue(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """GET messages?offset&limit is a slice of the full listing; purge, move and retry
    by id act on exactly the message named, once."""
    _fill(conn, "big", 30)
    _fill(conn, "big.to", 0)
    everything = _listed(broker, "big")
    assert len(everything) == 30
    _, page = http(broker, "/api/v1/queues/big/messages?offset=7&limit=9")
    assert [row["msg_id"] for row in page] == everything[7:16]
    doomed, moved = everything[12], everything[20]
    assert http(broker, "/api/v1/queues/big/purge", {"ids": [doomed]}) == (200, {"removed": 1})
    assert http(broker, "/api/v1/queues/big/purge", {"ids": [doomed]}) == (200, {"removed": 0})
    assert http(broker, "/api/v1/queues/big/move", {"ids": [moved], "to-queue": "big.to"}) == (
        200,
        {"moved": 1},
    )
    assert _listed(broker, "big") == [i for i in everything if i not in (doomed, moved)]
    assert len(_listed(broker, "big.to")) == 1


def test_by_id_on_paged_messages_reads_the_page_files(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-151: a message in the page files is found by id too (not in the index: the
    page files are read until it is found); browse lists memory then pages."""
    _fill(conn, "pg.q", 20)
    everything = _listed(broker, "pg.q")
    assert len(everything) == 20
    _, page = http(broker, "/api/v1/queues/pg.q/messages?offset=3&limit=6")
    assert [row["msg_id"] for row in page] == everything[3:9]
    paged, in_memory = everything[-2], everything[1]
    assert http(broker, "/api/v1/queues/pg.q/purge", {"ids": [paged, in_memory]}) == (
        200,
        {"removed": 2},
    )
    assert _listed(broker, "pg.q") == [i for i in everything if i not in (paged, in_memory)]
