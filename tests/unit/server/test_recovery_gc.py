"""Issue 23 item 4: the broker opens and recovers its journal with the cyclic garbage
collector paused (about half of recovery's CPU went to collections walking the growing
heap of recovered objects). Counted, not timed: no collection runs during recovery."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from proton import Message as ProtonMessage

from amqpbroker.config import parse_config
from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AddMessage, AddQueue, AddRef, Record
from amqpbroker.server import BrokerServer
from amqpbroker.store import FileJournal
from amqpbroker.store.recovery import collector_paused

MESSAGES = 3000  # thousands of objects: several young collections with the collector on


def _journal(directory: Path) -> None:
    data = ProtonMessage(body=b"x" * 10, durable=True).encode()
    records: list[Record] = [AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)]
    for msg_id in range(1, MESSAGES + 1):
        records.append(AddMessage(msg_id=msg_id, address="q", data=data))
        records.append(AddRef(queue="q", msg_id=msg_id))
    with FileJournal(directory, fsync=lambda fd: None) as journal:
        journal.append(records, sync=True)


def test_recovery_runs_no_garbage_collection(tmp_path: Path) -> None:
    _journal(tmp_path / "journal")
    config = parse_config("event-log: {enabled: false}\n", source="test.yaml")
    server = BrokerServer(config, data_dir=tmp_path)
    collections: list[int] = []
    recovering: list[bool] = []

    def counted(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and recovering:
            collections.append(info["generation"])

    whole = server._recover_journal  # all of the open, replay and rebuild

    def watched(loop: asyncio.AbstractEventLoop) -> None:
        recovering.append(True)
        try:
            whole(loop)
        finally:
            recovering.clear()

    server._recover_journal = watched  # type: ignore[method-assign]

    async def scenario() -> None:
        gc.callbacks.append(counted)
        try:
            server._open_journal(asyncio.get_running_loop())
        finally:
            gc.callbacks.remove(counted)

    assert gc.isenabled()
    try:
        asyncio.run(scenario())
    finally:
        assert server.journal is not None
        server.journal.close()
    assert server.broker.queues["q"].message_count == MESSAGES
    assert collections == []
    assert gc.isenabled()  # on again afterwards


def test_the_pause_restores_the_collector_as_it_was() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off: left off
    finally:
        gc.enable()


def test_the_broker_process_freezes_the_recovered_heap(tmp_path: Path) -> None:
    """`amqpbroker run` sets `freeze_recovered`: the recovered objects leave the
    collector's sight before it is on again (else its first collection walks them all)."""
    _journal(tmp_path / "journal")
    config = parse_config("event-log: {enabled: false}\n", source="test.yaml")
    server = BrokerServer(config, data_dir=tmp_path)
    server.freeze_recovered = True
    before = gc.get_freeze_count()

    async def scenario() -> None:
        server._open_journal(asyncio.get_running_loop())

    try:
        asyncio.run(scenario())
        assert gc.get_freeze_count() > before + 2 * MESSAGES
    finally:
        gc.unfreeze()  # the test process goes on collecting as before
        assert server.journal is not None
        server.journal.close()
    assert gc.isenabled()
