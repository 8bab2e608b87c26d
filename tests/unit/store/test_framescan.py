"""Issue 23 item 4, "Recovery, fifth pass": the open's bulk frame reader in C
(`store/_framescan.c`) checks frames as `frames.read_batches` does. Its crc is zlib's;
it reads exactly the frames the loop would read, the same entries, and stops where the
loop must read a frame itself (the opens it feeds are compared on random and damaged
journals in test_recovery_fast_paths.py and test_recovery_damaged.py)."""

from __future__ import annotations

import zlib
from pathlib import Path
from random import Random

import pytest
from support.framescan import framescan

import amqpbroker.store.frames as frames
from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.store import FileJournal, codec
from amqpbroker.store.frames import Entry
from amqpbroker.store.segments import HEADER_BYTES, _check_frame


def test_its_crc_is_zlibs() -> None:
    crc32 = framescan().crc32
    rng = Random(5)
    for length in [*range(40), 63, 64, 65, 1000, 1031, 4096]:
        data = rng.randbytes(length + 8)
        start = rng.randrange(8)
        value = rng.randrange(1 << 32)
        view = memoryview(data)[start : start + length]
        assert crc32(view, value) == zlib.crc32(view, value), length


def _segment(tmp_path: Path, seed: int) -> bytes:
    rng = Random(seed)
    with FileJournal(tmp_path, fsync=lambda fd: None, auto_compact=False) as journal:
        journal.append(
            [AddQueue(name=q, address=q, routing_type=RoutingType.ANYCAST) for q in "qré"],
            sync=True,
        )
        for msg_id in range(1, 200):
            records: list[Record] = [
                AddMessage(
                    msg_id=msg_id,
                    address=rng.choice(["q", "ré", "q" * 300]),
                    data=rng.randbytes(rng.randrange(0, 2000)),
                    durable=rng.random() < 0.9,
                    priority=rng.randrange(10),
                    expiration_ms=rng.choice([0, 1 << 40]),
                    first_ts=-msg_id,
                    header_end=rng.randrange(-1, 50),
                    head_end=rng.randrange(0, 50),
                    header_count=rng.randrange(-1, 3),
                ),
                AddRef(queue=rng.choice("qré"), msg_id=msg_id, delivery_count=rng.randrange(3)),
            ]
            if rng.random() < 0.2:
                records.append(AckRef(queue="q", msg_id=rng.randrange(1, msg_id + 1)))
            journal.append(records, sync=False)
        journal.flush()
    (path,) = tmp_path.glob("journal-*.seg")
    return path.read_bytes()


def _read(data: bytes, pos: int) -> list[tuple[int, list[Entry], int, int]]:
    """What `read_batches` reads from `pos` until it stops, and where: each frame it
    stops at skipped (with the full checks) and read on from, to the end."""
    out = []
    batch: list[Entry] = []
    top = 0
    while pos < len(data):
        done: list[tuple[list[Entry], int]] = []
        pos, batch, top, acks = frames.read_batches(data, pos, batch, top, done)
        out += [(pos, entries, done_top, acks) for entries, done_top in done]
        out.append((pos, list(batch), top, acks))
        checked = _check_frame(data, pos)
        if not isinstance(checked, tuple):
            break
        pos = checked[0]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_loop_with_the_c_reader_reads_what_the_loop_reads_alone(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _segment(tmp_path, seed)
    monkeypatch.setattr(frames, "_scan", None)
    alone = _read(data, HEADER_BYTES)
    monkeypatch.setattr(frames, "_scan", framescan().scan)
    assert _read(data, HEADER_BYTES) == alone
    rng = Random(seed)
    for _ in range(30):  # and from a flipped byte on: the same frames, the same stop
        at = rng.randrange(HEADER_BYTES, len(data))
        bad = data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
        monkeypatch.setattr(frames, "_scan", None)
        alone = _read(bad, HEADER_BYTES)
        monkeypatch.setattr(frames, "_scan", framescan().scan)
        assert _read(bad, HEADER_BYTES) == alone, at


def test_it_stops_at_a_frame_it_does_not_read(tmp_path: Path) -> None:
    """An AddQueue first: `scan` takes nothing and says so (the loop reads that frame)."""
    data = _segment(tmp_path, 0)
    batch: list[Entry] = []
    pos, left, top = framescan().scan(data, HEADER_BYTES, batch, 0, [], codec._STRINGS)
    assert (pos, left, top) == (HEADER_BYTES, batch, 0)
