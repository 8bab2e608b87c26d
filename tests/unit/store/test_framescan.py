"""Issue 23 item 4, "Recovery, fifth pass": the open's bulk frame reader in C
(`store/_framescan.c`) checks frames as `frames.read_batches` does. Its crc is zlib's;
it reads exactly the frames the loop would read, the same entries, and stops where the
loop must read a frame itself (the opens it feeds are compared on random and damaged
journals in test_recovery_fast_paths.py and test_recovery_damaged.py)."""

from __future__ import annotations

import struct
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
from amqpbroker.store.segments import FRAME_BYTES, HEADER_BYTES, _check_frame


def test_its_crc_is_zlibs() -> None:
    """Both paths: by carry-less multiplication where the CPU has it (64 bytes and more,
    `FOLDED_CRC`; issue 23, eighth pass) and by the tables (the rest, and other CPUs)."""
    module = framescan()
    rng = Random(5)
    lengths = [*range(300), 1000, 1031, 1100, 4096, 65543, *rng.sample(range(300, 9000), 40)]
    for crc32 in (module.crc32, module.crc32_tables):
        for length in lengths:
            data = rng.randbytes(length + 8)
            start = rng.randrange(8)
            value = rng.choice([0, 0xFFFFFFFF, rng.randrange(1 << 32)])
            view = memoryview(data)[start : start + length]
            assert crc32(view, value) == zlib.crc32(view, value), (crc32, length)


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


_LIES = [
    0,
    1,
    14,
    15,
    20,
    21,
    23,
    24,
    54,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
    1 << 30,
    (1 << 30) + 1,
]


def _refit(buf: bytearray, pos: int) -> None:
    """Give the frame at `pos` the crc of what it now holds (when it fits in `buf`)."""
    if pos + FRAME_BYTES > len(buf):
        return
    end = pos + FRAME_BYTES + struct.unpack_from("<I", buf, pos)[0]
    if end <= len(buf):
        crc = zlib.crc32(bytes(buf[pos + 8 : end]), zlib.crc32(bytes(buf[pos : pos + 4])))
        struct.pack_into("<I", buf, pos + 4, crc)


def _lie(data: bytes, rng: Random, starts: list[int]) -> bytes:
    """One length that lies, in a frame whose crc is then right again: the frame's own
    length, an address, body or queue name length, or a frame cut to a few bytes."""
    buf = bytearray(data)
    pos = rng.choice(starts)
    length, _, type_id, _ = struct.unpack_from("<IIHH", buf, pos)
    payload = pos + FRAME_BYTES
    kind = rng.randrange(4)
    if kind == 0:
        rest = len(buf) - payload
        lie = rng.choice([*_LIES, rest, rest + 1, rest - 1, length + 1, length - 1])
        struct.pack_into("<I", buf, pos, lie & 0xFFFFFFFF)
    elif kind == 1 and type_id == 45:  # AddMessage
        address_len = struct.unpack_from("<I", buf, payload + 11)[0]
        if rng.random() < 0.5:
            lie = rng.choice([*_LIES, address_len + 1, address_len - 1, length - 21])
            struct.pack_into("<I", buf, payload + 11, lie & 0xFFFFFFFF)
        else:
            at = payload + 15 + address_len + 2
            body = struct.unpack_from("<I", buf, at)[0]
            lie = rng.choice([*_LIES, body + 1, body - 1, body + 27, body - 27])
            struct.pack_into("<I", buf, at, lie & 0xFFFFFFFF)
    elif kind == 1 or kind == 2:  # an AddRef's queue name length, or its last byte cut
        if type_id == 32:
            name_len = struct.unpack_from("<I", buf, payload + 2)[0]
            lie = rng.choice([*_LIES, name_len + 1, name_len - 1])
            struct.pack_into("<I", buf, payload + 2, lie & 0xFFFFFFFF)
        elif length:
            struct.pack_into("<I", buf, pos, length - 1)
            del buf[payload + length - 1]
    else:  # a frame of 0 to 25 bytes of a type the reader takes, first bytes plausible
        size = rng.choice([0, 1, 2, 14, 15, 20, 21, 23, 24, 25])
        body = bytes([rng.choice([3, 10]), rng.choice([3, 4])]) + rng.randbytes(size)
        buf[pos:pos] = struct.pack("<IIHH", size, 0, rng.choice([32, 45]), 1) + body[:size]
    _refit(buf, pos)
    return bytes(buf)


def test_lengths_that_lie_in_frames_whose_crc_is_right_are_read_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 attack: a flipped byte fails the crc, so the test above never reached the
    payload checks of the C reader; here each frame's crc is made right after its lengths
    are made to lie (address, body and queue lengths near 2^31, 2^32, the payload's
    bounds; zero-length frames). Both readers take the same frames and stop at the same
    place. (Run under AddressSanitizer too: docs/security.md, "The C frame reader".)"""
    data = _segment(tmp_path, 7)
    starts = []
    pos = HEADER_BYTES
    while isinstance(checked := _check_frame(data, pos), tuple):
        starts.append(pos)
        pos = checked[0]
    rng = Random(7)
    for case in range(250):
        bad = _lie(data, rng, starts)
        monkeypatch.setattr(frames, "_scan", None)
        alone = _read(bad, HEADER_BYTES)
        monkeypatch.setattr(frames, "_scan", framescan().scan)
        assert _read(bad, HEADER_BYTES) == alone, case
