"""FileJournal on disk: torn tails, corruption, group commit, write errors, segments, and
compaction keeping disk use bounded.

The writer thread is real. Waits are bounded (`threading.Event.wait`, `wait_until`); fsync
is replaced where a test counts or gates it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.waiting import wait_until

import amqpbroker.store.compaction as compaction
import amqpbroker.store.failure as failure
import amqpbroker.store.file_journal as file_journal
import amqpbroker.store.opening as opening
import amqpbroker.store.segments as segment_format
from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddAddress,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteQueue,
    Record,
    RecordType,
    UpdateDeliveryCount,
)
from amqpbroker.store import (
    CodecError,
    FileJournal,
    JournalCorrupt,
    JournalError,
    JournalFailed,
    JournalState,
    codec,
    export_jsonl,
)
from amqpbroker.store.liveness import _ignore_dead, _LiveSet, _short_lived

LOGGER = "amqpbroker.store.journal"
FRAME = struct.Struct("<IIHH")
HEADER_BYTES = 16


def open_journal(directory: Path, **kw: object) -> FileJournal:
    options: dict[str, object] = {"max_segment_bytes": 1024, "auto_compact": False}
    options.update(kw)
    return FileJournal(directory, **options)  # type: ignore[arg-type]


@pytest.fixture
def journals() -> Iterator[list[FileJournal]]:
    """Journals a test opened; closed at the end even if the test fails."""
    opened: list[FileJournal] = []
    yield opened
    for journal in opened:
        journal.close()


def append(journal: FileJournal, records: list[Record], *, sync: bool = True) -> None:
    done = threading.Event()
    outcome: list[JournalFailed | None] = []

    def on_durable(error: JournalFailed | None) -> None:
        outcome.append(error)
        done.set()

    journal.append(records, sync=sync, on_durable=on_durable)
    assert done.wait(5)
    assert outcome == [None]


def message(msg_id: int, size: int = 40) -> AddMessage:
    return AddMessage(msg_id=msg_id, address="orders", data=b"m" * size)


def address(i: int) -> AddAddress:
    return AddAddress(name=f"a{i}", routing_types=(RoutingType.ANYCAST,))


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("journal-*.seg"))


def frame_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    offsets, pos = [], HEADER_BYTES
    while pos < len(data):
        offsets.append(pos)
        length = FRAME.unpack_from(data, pos)[0]
        pos += FRAME.size + length
    return offsets


def replay_all(directory: Path, **kw: object) -> list[Record]:
    journal = open_journal(directory, **kw)
    try:
        return list(journal.replay())
    finally:
        journal.close()


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# --- recovery: torn tails ------------------------------------------------------------


def test_torn_last_append_is_truncated_at_every_byte_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut the file anywhere inside the last append: replay yields exactly the appends
    before it, the file is truncated to them, and the loss is logged."""
    source = tmp_path / "source"
    journal = open_journal(source, max_segment_bytes=1 << 20)
    first: list[Record] = [message(1), AddRef(queue="q", msg_id=1)]
    append(journal, first)
    keep = journal.size_bytes
    last: list[Record] = [
        message(2),
        AddRef(queue="q", msg_id=2),
        UpdateDeliveryCount(queue="q", msg_id=1, delivery_count=3),
    ]
    append(journal, last)
    journal.close()
    (segment,) = segments(source)
    data = segment.read_bytes()
    assert replay_all(source) == first + last

    for cut in range(keep + 1, len(data)):
        directory = tmp_path / str(cut)
        directory.mkdir()
        (directory / segment.name).write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            records = replay_all(directory)
        assert records == first, f"cut at {cut}"
        assert (directory / segment.name).stat().st_size == keep, f"cut at {cut}"
        assert f"losing {cut - keep} bytes" in caplog.text, f"cut at {cut}"
        assert "torn tail" in caplog.text
        shutil.rmtree(directory)


def test_appends_after_a_truncated_tail_replay_after_the_good_records(tmp_path: Path) -> None:
    journal = open_journal(tmp_path)
    append(journal, [address(1)])
    append(journal, [address(2)])
    journal.close()
    (segment,) = segments(tmp_path)
    segment.write_bytes(segment.read_bytes()[:-3])
    journal = open_journal(tmp_path)
    append(journal, [address(3)])
    journal.close()
    assert replay_all(tmp_path) == [address(1), address(3)]


def test_corrupt_last_record_is_truncated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = open_journal(tmp_path)
    for i in range(3):
        append(journal, [address(i)])
    journal.close()
    (segment,) = segments(tmp_path)
    last = frame_offsets(segment)[-1]
    flip_byte(segment, last + FRAME.size + 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert replay_all(tmp_path) == [address(0), address(1)]
    assert "checksum mismatch" in caplog.text
    assert segment.stat().st_size == last


def test_zero_filled_tail_is_truncated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A crash can leave zeros where an unsynced write would have gone."""
    journal = open_journal(tmp_path)
    append(journal, [address(1)])
    journal.close()
    (segment,) = segments(tmp_path)
    size = segment.stat().st_size
    with segment.open("ab") as f:
        f.write(bytes(4096))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert replay_all(tmp_path) == [address(1)]
    assert "losing 4096 bytes" in caplog.text
    assert segment.stat().st_size == size


def _long_claims(size: int) -> bytes:
    """A bad frame, then frame headers every 12 bytes (a known type, plausible flags),
    each claiming a length to near the end: every one a candidate for the search."""
    headers = size // FRAME.size
    out = bytearray()
    for n in range(headers):
        rest = (headers - n - 1) * FRAME.size
        out += FRAME.pack(max(0, rest - FRAME.size), 0, int(RecordType.ADD_MESSAGE), 0)
    return bytes(out)


@pytest.mark.parametrize("skip", [False, True])
def test_a_tail_crafted_to_make_the_search_quadratic_is_bounded(tmp_path: Path, skip: bool) -> None:
    """Issue 15 attack (B-153, crafted journal files): after a bad frame the open
    looks for a sound one, checking each candidate's crc over the bytes it claims; a
    tail of candidates each claiming most of the rest made that quadratic (200 KB:
    0.8 s of CPU; 2 MB: ~80 s; a 64 MiB segment: a day). The search has a budget
    (16 times the segment, plus 64 MiB); past it the tail is not taken for torn: the
    open stops with JournalCorrupt, or with skip_corrupt skips the rest."""
    journal = open_journal(tmp_path, max_segment_bytes=1 << 30)
    append(journal, [address(1)])
    journal.close()
    (segment,) = segments(tmp_path)
    sound = segment.stat().st_size
    with segment.open("ab") as f:
        f.write(_long_claims(3_000_000))
    started = time.process_time()
    if skip:
        assert replay_all(tmp_path, skip_corrupt=True) == [address(1)]
    else:
        with pytest.raises(JournalCorrupt) as raised:
            replay_all(tmp_path)
        assert raised.value.offset == sound
    assert time.process_time() - started < 10  # (before: ~3 minutes)


def test_segment_with_an_incomplete_header_is_recreated(tmp_path: Path) -> None:
    """A crash while rolling to a new segment leaves it without a whole header."""
    journal = open_journal(tmp_path)
    append(journal, [address(1)])
    journal.close()
    (tmp_path / "journal-00000002.seg").write_bytes(b"AMQP")
    journal = open_journal(tmp_path)
    append(journal, [address(2)])
    journal.close()
    assert replay_all(tmp_path) == [address(1), address(2)]


# --- recovery: corruption in the middle ----------------------------------------------


def test_corrupt_record_in_the_middle_raises_with_file_and_offset(tmp_path: Path) -> None:
    journal = open_journal(tmp_path)
    for i in range(5):
        append(journal, [address(i)])
    journal.close()
    (segment,) = segments(tmp_path)
    bad = frame_offsets(segment)[1]
    flip_byte(segment, bad + FRAME.size + 3)
    with pytest.raises(JournalCorrupt) as raised:
        open_journal(tmp_path)
    assert raised.value.path == segment
    assert raised.value.offset == bad
    assert f"{segment} at offset {bad}" in str(raised.value)
    assert segment.stat().st_size > bad  # nothing was truncated


def test_corrupt_tail_of_an_earlier_segment_is_corruption_not_a_torn_tail(
    tmp_path: Path,
) -> None:
    """Only the last segment can have a torn tail: earlier ones were synced before the roll."""
    journal = open_journal(tmp_path, max_segment_bytes=256)
    for i in range(20):
        append(journal, [address(i)])
    journal.close()
    first = segments(tmp_path)[0]
    bad = frame_offsets(first)[-1]
    flip_byte(first, bad + FRAME.size + 1)
    with pytest.raises(JournalCorrupt) as raised:
        open_journal(tmp_path, max_segment_bytes=256)
    assert (raised.value.path, raised.value.offset) == (first, bad)


def test_damaged_frame_header_in_the_middle_raises(tmp_path: Path) -> None:
    journal = open_journal(tmp_path)
    for i in range(5):
        append(journal, [address(i)])
    journal.close()
    (segment,) = segments(tmp_path)
    bad = frame_offsets(segment)[2]
    data = bytearray(segment.read_bytes())
    data[bad : bad + 4] = b"\xf0\xff\xff\xff"  # an impossible length
    segment.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as raised:
        open_journal(tmp_path)
    assert raised.value.offset == bad


@pytest.mark.parametrize("damage", ["payload", "length"])
def test_skip_corrupt_skips_the_damaged_record_and_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    journal = open_journal(tmp_path)
    for i in range(5):
        append(journal, [address(i)])
    journal.close()
    (segment,) = segments(tmp_path)
    bad = frame_offsets(segment)[2]
    if damage == "payload":
        flip_byte(segment, bad + FRAME.size + 3)
    else:
        flip_byte(segment, bad + 3)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        journal = open_journal(tmp_path, skip_corrupt=True)
    try:
        assert list(journal.replay()) == [address(0), address(1), address(3), address(4)]
        append(journal, [address(5)])
    finally:
        journal.close()
    assert f"at offset {bad}" in caplog.text
    assert "skip_corrupt" in caplog.text
    assert replay_all(tmp_path, skip_corrupt=True)[-1] == address(5)


def test_record_of_an_unknown_type_is_never_truncated(tmp_path: Path) -> None:
    """A sound frame this version cannot read (a newer writer) is refused, not cut off."""
    journal = open_journal(tmp_path)
    append(journal, [address(1)])
    journal.close()
    (segment,) = segments(tmp_path)
    size = segment.stat().st_size
    with segment.open("ab") as f:
        f.write(segment_format._frame(999, segment_format.BATCH_END, b"\x00"))
    with pytest.raises(JournalCorrupt, match="unknown record type 999"):
        open_journal(tmp_path)
    assert segment.stat().st_size > size


# --- record payloads -----------------------------------------------------------------


def ref_payload(*values: tuple[int, bytes]) -> bytes:
    """An AddRef-shaped payload from (tag, body) values, as a writer would make it."""
    return bytes([len(values)]) + b"".join(bytes([tag]) + body for tag, body in values)


QUEUE_Q = (4, struct.pack("<I", 1) + b"q")


def i64(value: int) -> tuple[int, bytes]:
    return (3, struct.pack("<q", value))


def test_payload_with_fields_from_a_newer_writer_decodes() -> None:
    payload = ref_payload(QUEUE_Q, i64(7), i64(2), i64(99))
    assert codec.decode(RecordType.ADD_REF, payload) == AddRef(
        queue="q", msg_id=7, delivery_count=2
    )


def test_payload_without_a_later_field_gets_its_default() -> None:
    payload = ref_payload(QUEUE_Q, i64(7))
    assert codec.decode(RecordType.ADD_REF, payload) == AddRef(queue="q", msg_id=7)


def test_payload_without_a_required_field_is_an_error() -> None:
    with pytest.raises(CodecError, match="lacks msg_id"):
        codec.decode(RecordType.ADD_REF, ref_payload(QUEUE_Q))


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x01", b"\x01\x63", b"\x01\x04\xff\x00\x00\x00", b"\x00\x00"],
    ids=["empty", "missing value", "unknown tag", "string too long", "trailing bytes"],
)
def test_malformed_payload_is_an_error(payload: bytes) -> None:
    with pytest.raises(CodecError):
        codec.decode_values(payload)


def test_integer_outside_64_bits_cannot_be_encoded() -> None:
    with pytest.raises(CodecError, match="i64"):
        codec.encode(AddRef(queue="q", msg_id=2**63))


# --- group commit --------------------------------------------------------------------


class GatedFsync:
    """Counts fsyncs; the first one waits until the test opens the gate."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.callbacks_before: list[int] = []  # callbacks already run, at each fsync
        self.callbacks_run: list[str] = []

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.callbacks_before.append(len(self.callbacks_run))
        self.entered.set()
        assert self.gate.wait(5)
        os.fdatasync(fd)


def test_appends_queued_during_an_fsync_share_the_next_one(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    """Group commit: 200 durable appends made while the disk is busy cost one fsync."""
    fsync = GatedFsync()
    journal = open_journal(tmp_path, fsync=fsync, max_segment_bytes=1 << 20)
    journals.append(journal)
    all_done = threading.Event()
    errors: list[JournalFailed | None] = []

    def on_durable(error: JournalFailed | None) -> None:
        fsync.callbacks_run.append(threading.current_thread().name)
        errors.append(error)
        if len(errors) == 201:
            all_done.set()

    journal.append([message(0)], sync=True, on_durable=on_durable)
    assert fsync.entered.wait(5)
    for i in range(1, 201):
        journal.append([message(i), AddRef(queue="q", msg_id=i)], sync=True, on_durable=on_durable)
    fsync.gate.set()
    assert all_done.wait(5)

    assert fsync.calls == 2
    assert fsync.callbacks_before == [0, 1]  # no callback ran before its records' fsync
    assert errors == [None] * 201
    assert {name.split(" ")[0] for name in fsync.callbacks_run} == {"journal-writer"}
    journal.flush(timeout=5)
    assert fsync.calls == 2  # nothing new to sync
    assert len(JournalState.of(journal.replay()).messages) == 200


def test_sync_false_appends_do_not_wait_for_an_fsync(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    syncs: list[float] = []
    calls = []
    journal = open_journal(
        tmp_path, fsync=calls.append, sync_seconds=syncs.append, lazy_sync_seconds=60
    )
    journals.append(journal)
    for i in range(10):
        append(journal, [address(i)], sync=False)
    assert calls == []
    journal.flush(timeout=5)
    assert len(calls) == 1
    assert len(syncs) == 1
    assert syncs[0] >= 0


def test_sync_false_appends_are_synced_after_lazy_sync_seconds(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    synced = threading.Event()

    def fsync(fd: int) -> None:
        synced.set()

    journal = open_journal(tmp_path, fsync=fsync, lazy_sync_seconds=0.01)
    journals.append(journal)
    journal.append([address(1)], sync=False)
    assert synced.wait(5)


def test_durable_throughput_from_many_threads_needs_few_fsyncs(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    journal = open_journal(tmp_path, max_segment_bytes=1 << 20)
    journals.append(journal)
    done = threading.Semaphore(0)

    def producer(base: int) -> None:
        for i in range(base, base + 100):
            journal.append(
                [message(i), AddRef(queue="q", msg_id=i)],
                sync=True,
                on_durable=lambda error: done.release(),
            )

    threads = [threading.Thread(target=producer, args=(t * 1000,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    for _ in range(400):
        assert done.acquire(timeout=5)
    assert journal.syncs < 400
    assert len(JournalState.of(journal.replay()).messages) == 400


# --- write errors --------------------------------------------------------------------


def test_disk_full_fails_durable_appends_and_keeps_synced_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    journal = open_journal(tmp_path)
    append(journal, [message(1), AddRef(queue="q", msg_id=1)])
    size = journal.size_bytes
    real_write = file_journal._write_fd

    def disk_full(fd: int, data: bytes | memoryview) -> None:
        real_write(fd, bytes(data)[: len(data) // 2])  # a partial write, then the error
        raise OSError(errno.ENOSPC, "No space left on device")

    for module in (file_journal, failure):  # the writer and its retry probe
        monkeypatch.setattr(module, "_write_fd", disk_full)
    errors: list[JournalFailed | None] = []
    failed = threading.Event()

    def on_durable(error: JournalFailed | None) -> None:
        errors.append(error)
        failed.set()

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        journal.append([message(2), AddRef(queue="q", msg_id=2)], sync=True, on_durable=on_durable)
        assert failed.wait(5)
    error = errors[0]
    assert isinstance(error, JournalFailed)
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.ENOSPC
    assert journal.failure is error
    assert "No space left on device" in caplog.text

    later: list[JournalFailed | None] = []
    journal.append([message(3)], sync=True, on_durable=later.append)
    with pytest.raises(JournalFailed):
        journal.flush(timeout=5)
    assert later == [error]
    journal.close()

    monkeypatch.undo()
    assert segments(tmp_path)[-1].stat().st_size == size  # the partial write was dropped
    state = JournalState.of(replay_all(tmp_path))
    assert list(state.messages) == [1]


def test_fsync_error_fails_the_journal(tmp_path: Path, journals: list[FileJournal]) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    journal = open_journal(tmp_path, fsync=broken)
    journals.append(journal)
    errors: list[JournalFailed | None] = []
    done = threading.Event()
    journal.append([address(1)], sync=True, on_durable=lambda e: (errors.append(e), done.set()))
    assert done.wait(5)
    assert isinstance(errors[0], JournalFailed)
    assert isinstance(errors[0].__cause__, OSError)
    assert errors[0].__cause__.errno == errno.EIO
    assert journal.compact().segments_deleted == 0  # a failed journal is left alone


def test_a_raising_callback_is_logged_and_the_writer_goes_on(
    tmp_path: Path, journals: list[FileJournal], caplog: pytest.LogCaptureFixture
) -> None:
    journal = open_journal(tmp_path)
    journals.append(journal)

    def broken(error: JournalFailed | None) -> None:
        raise RuntimeError("callback bug")

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        journal.append([address(1)], sync=True, on_durable=broken)
        append(journal, [address(2)])
    assert "on_durable callback failed" in caplog.text
    assert journal.failure is None


class _NoDescriptors:
    """The `os` module as the journal sees it, whose `open` fails with EMFILE while
    `exhausted` is set: a process whose sockets took every file descriptor."""

    def __init__(self) -> None:
        self.exhausted = False

    def open(self, *args: object, **kw: object) -> int:
        if self.exhausted:
            raise OSError(errno.EMFILE, "Too many open files")
        return os.open(*args, **kw)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


def _failing_append(journal: FileJournal, records: list[Record]) -> JournalFailed:
    errors: list[JournalFailed | None] = []
    done = threading.Event()
    journal.append(records, sync=True, on_durable=lambda e: (errors.append(e), done.set()))
    assert done.wait(5)
    error = errors[0]
    assert isinstance(error, JournalFailed)
    return error


def test_a_roll_needs_no_new_descriptor_and_a_failed_roll_recovers(
    tmp_path: Path, journals: list[FileJournal], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 item 1: with no descriptor left, the next segment (opened ahead of need)
    still takes the roll; the roll after it fails (no spare could be made), and once
    descriptors come back the journal resumes by itself and the next append works."""
    no_fds = _NoDescriptors()
    for module in (file_journal, segment_format, opening, failure):  # as the journal sees it
        monkeypatch.setattr(module, "os", no_fds)
    journal = open_journal(tmp_path, max_segment_bytes=256)
    journals.append(journal)
    resumed = threading.Event()
    journal.on_resume(resumed.set)
    append(journal, [message(1, size=150), AddRef(queue="q", msg_id=1)])
    no_fds.exhausted = True
    append(journal, [message(2, size=150), AddRef(queue="q", msg_id=2)])  # rolls: the spare
    assert journal.segment_count == 2
    error = _failing_append(journal, [message(3, size=150), AddRef(queue="q", msg_id=3)])
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.EMFILE
    assert journal.errors >= 1
    no_fds.exhausted = False
    assert resumed.wait(10)
    append(journal, [message(4, size=150), AddRef(queue="q", msg_id=4)])
    journal.close()
    monkeypatch.undo()
    assert sorted(JournalState.of(replay_all(tmp_path)).messages) == [1, 2, 4]


def test_a_failed_pass_is_taken_back_and_the_journal_resumes(
    tmp_path: Path, journals: list[FileJournal], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 15 item 2: an fsync that fails after the write leaves nothing of the refused
    append in the file (a restart neither replays it nor finds garbage); retries back
    off, the log says it once when it fails and once when it resumes, and the journal
    indexes and compacts as before."""
    disk_full = threading.Event()

    def fsync(fd: int) -> None:
        if disk_full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        os.fdatasync(fd)

    journal = open_journal(tmp_path, fsync=fsync, max_segment_bytes=512)
    journals.append(journal)
    resumed = threading.Event()
    journal.on_resume(resumed.set)
    append(journal, [message(1), AddRef(queue="q", msg_id=1)])
    size = segments(tmp_path)[-1].stat().st_size
    with caplog.at_level(logging.INFO, logger=LOGGER):
        disk_full.set()
        _failing_append(journal, [message(2), AddRef(queue="q", msg_id=2)])
        assert segments(tmp_path)[-1].stat().st_size == size  # the refused append is gone
        wait_until(lambda: journal.errors >= 3, timeout=10)  # retries, backing off
        disk_full.clear()
        assert resumed.wait(10)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1
    assert "No space left on device" in warnings[0].getMessage()
    assert len(infos) == 1
    assert "writing again" in infos[0].getMessage()
    for msg_id in range(3, 12):  # past a few rolls, with acks: compaction has work
        append(journal, [message(msg_id), AddRef(queue="q", msg_id=msg_id)])
        append(journal, [AckRef(queue="q", msg_id=msg_id - 1)])
    compacted = journal.compact()
    assert compacted.size_bytes_after < compacted.size_bytes_before
    journal.close()
    assert sorted(JournalState.of(replay_all(tmp_path)).messages) == [1, 11]


# --- segments ------------------------------------------------------------------------


def test_segments_roll_at_the_size_limit(tmp_path: Path, journals: list[FileJournal]) -> None:
    journal = open_journal(tmp_path, max_segment_bytes=512)
    journals.append(journal)
    expected: list[Record] = []
    for i in range(30):
        records: list[Record] = [message(i), AddRef(queue="q", msg_id=i)]
        append(journal, records)
        expected.extend(records)
    big = message(99, size=2000)  # bigger than a segment: gets one of its own
    append(journal, [big])
    expected.append(big)
    files = segments(tmp_path)
    assert len(files) > 5
    assert [p.name for p in files][:2] == ["journal-00000001.seg", "journal-00000002.seg"]
    assert all(p.read_bytes()[:8] == b"AMQPBJNL" for p in files)
    assert all(p.stat().st_size <= 512 for p in files[:-1])
    assert files[-1].stat().st_size > 2000
    assert list(journal.replay()) == expected


def test_second_writer_on_the_same_directory_is_refused(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    journals.append(open_journal(tmp_path))
    with pytest.raises(JournalError, match="in use"):
        open_journal(tmp_path)
    with pytest.raises(JournalError, match="in use"):
        FileJournal(tmp_path, read_only=True)


def test_read_only_open_changes_nothing(tmp_path: Path) -> None:
    journal = open_journal(tmp_path)
    append(journal, [address(1)])
    journal.close()
    (segment,) = segments(tmp_path)
    torn = segment.read_bytes() + b"\x05\x00"
    segment.write_bytes(torn)
    reader = FileJournal(tmp_path, read_only=True)
    try:
        assert list(reader.replay()) == [address(1)]
    finally:
        reader.close()
    assert segment.read_bytes() == torn


# --- compaction ----------------------------------------------------------------------


@pytest.mark.parametrize("auto_compact", [False, True])
def test_disk_use_stays_bounded_under_steady_add_and_ack(
    tmp_path: Path, journals: list[FileJournal], auto_compact: bool
) -> None:
    """Produce and consume 3000 messages with 20 in flight: disk use stays a few segments."""
    segment_bytes = 2048
    journal = open_journal(
        tmp_path,
        max_segment_bytes=segment_bytes,
        fsync=lambda fd: None,
        auto_compact=auto_compact,
    )
    journals.append(journal)
    largest = 0
    for i in range(3000):
        journal.append([message(i), AddRef(queue="q", msg_id=i)], sync=True)
        if i >= 20:
            journal.append([AckRef(queue="q", msg_id=i - 20)], sync=False)
        if i % 50 == 49:
            journal.flush(timeout=5)
            if not auto_compact:
                journal.compact()
            largest = max(largest, journal.size_bytes)
    journal.flush(timeout=5)
    if auto_compact:
        wait_until(lambda: journal.segment_count <= 4, message="auto compaction")
    else:
        journal.compact()
        assert largest <= 8 * segment_bytes
    assert journal.segment_count <= 4
    assert journal.size_bytes <= 4 * segment_bytes
    state = JournalState.of(journal.replay())
    assert sorted(state.messages) == list(range(2980, 3000))


def test_tombstone_written_during_a_compaction_outlives_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message acked while compaction copies it must stay acked after later compactions."""
    journal = open_journal(tmp_path, max_segment_bytes=2048, compact_live_ratio=0.5)
    append(journal, [message(1, size=150), AddRef(queue="q", msg_id=1)])
    append(journal, [message(2, size=150), AddRef(queue="q", msg_id=2)])
    dead = 10
    while journal.segment_count < 2:  # dead weight: the first segment is mostly dead
        append(journal, [message(dead, 100), AddRef(queue="q", msg_id=dead)])
        append(journal, [AckRef(queue="q", msg_id=dead)])
        dead += 1
    real_write = file_journal._write_fd
    main = threading.current_thread()
    acked = []

    def ack_during_copy(fd: int, data: bytes | memoryview) -> None:
        if threading.current_thread() is main and not acked:
            acked.append(True)
            append(journal, [AckRef(queue="q", msg_id=1)])  # written by the writer thread
        real_write(fd, data)

    monkeypatch.setattr(compaction, "_write_fd", ack_during_copy)
    assert journal.compact().segments_rewritten == 1
    monkeypatch.undo()
    assert acked
    while journal.segment_count < 3:  # seal the segment holding the AckRef
        append(journal, [address(0)])
    journal.compact()
    journal.close()
    assert list(JournalState.of(replay_all(tmp_path)).messages) == [2]


def test_compaction_never_acts_on_records_not_yet_synced(tmp_path: Path) -> None:
    """An ack still waiting for its fsync must not let compaction delete the message."""
    fsync = GatedFsync()
    fsync.gate.set()
    journal = open_journal(tmp_path, fsync=fsync, max_segment_bytes=256)
    append(journal, [message(1), AddRef(queue="q", msg_id=1)])
    while journal.segment_count < 2:
        append(journal, [address(0)])
    first = segments(tmp_path)[0]
    fsync.gate.clear()
    fsync.entered.clear()
    acked = threading.Event()
    journal.append([AckRef(queue="q", msg_id=1)], sync=True, on_durable=lambda e: acked.set())
    assert fsync.entered.wait(5)  # written, not yet on disk

    journal.compact()
    assert first.exists()

    fsync.gate.set()
    assert acked.wait(5)
    journal.compact()
    assert not first.exists()
    journal.close()


def test_crash_between_compaction_rename_and_deletes_replays_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The merged file and the segments it replaces are both on disk: same state."""
    journal = open_journal(tmp_path, max_segment_bytes=1024, compact_live_ratio=0.9)
    appends: list[list[Record]] = []
    for i in range(40):
        records: list[Record] = [message(i, 10), AddRef(queue="q", msg_id=i)]
        if i % 4 == 0:
            records.append(UpdateDeliveryCount(queue="q", msg_id=i, delivery_count=i))
        appends.append(records)
    appends.extend([AckRef(queue="q", msg_id=i)] for i in range(40) if i % 4)
    model = JournalState()
    for records in appends:
        append(journal, records)
        for record in records:
            model.apply(record)
    real_replace = os.replace
    before_rename: list[set[Path]] = []

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        before_rename.append(set(segments(tmp_path)))
        real_replace(src, dst)

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if before_rename:  # the process "dies" between the rename and the deletes
            raise OSError(errno.EIO, "simulated crash")
        os.unlink(self)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "unlink", unlink)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        journal.compact()
    monkeypatch.undo()
    assert "compaction stopped" in caplog.text
    journal.close()
    assert set(segments(tmp_path)) == before_rename[0]  # renamed over, nothing deleted
    records = replay_all(tmp_path)
    copied = [r.msg_id for r in records if isinstance(r, AddMessage)]
    assert len(copied) > len(set(copied))  # the run's live records are there twice
    state = JournalState.of(records)
    assert state.messages == model.messages
    assert state.refs() == model.refs()

    journal = open_journal(tmp_path, max_segment_bytes=1024, compact_live_ratio=0.9)
    journal.compact()
    assert len(segments(tmp_path)) < len(before_rename[0])
    journal.close()
    assert JournalState.of(replay_all(tmp_path)).refs() == model.refs()


def test_message_without_references_is_dropped_on_reopen(tmp_path: Path) -> None:
    """An AddMessage whose references never reached the disk is dead after a restart."""
    journal = open_journal(tmp_path, max_segment_bytes=256)
    append(journal, [message(1)])
    while journal.segment_count < 3:
        append(journal, [address(0)])
    journal.close()
    journal = open_journal(tmp_path, max_segment_bytes=256)
    try:
        assert JournalState.of(journal.replay()).messages == {}
        journal.compact()
        assert not any(isinstance(r, AddMessage) for r in journal.replay())
    finally:
        journal.close()


def test_leftover_compaction_file_is_deleted_on_open(tmp_path: Path) -> None:
    journal = open_journal(tmp_path)
    append(journal, [address(1)])
    journal.close()
    leftover = tmp_path / "journal-00000001.seg.compact"
    leftover.write_bytes(b"half a file")
    assert replay_all(tmp_path) == [address(1)]
    assert not leftover.exists()


# --- export --------------------------------------------------------------------------


def test_export_lists_addresses_queues_and_live_messages(tmp_path: Path) -> None:
    journal = open_journal(tmp_path)
    append(journal, [AddAddress(name="orders", routing_types=(RoutingType.MULTICAST,))])
    append(
        journal,
        [
            AddQueue(name="q1", address="orders", routing_type=RoutingType.MULTICAST),
            AddQueue(name="q2", address="orders", routing_type=RoutingType.MULTICAST),
        ],
    )
    append(
        journal, [message(1, size=3), AddRef(queue="q1", msg_id=1), AddRef(queue="q2", msg_id=1)]
    )
    append(journal, [message(2, size=3), AddRef(queue="q1", msg_id=2)])
    append(journal, [UpdateDeliveryCount(queue="q2", msg_id=1, delivery_count=2)])
    append(journal, [AckRef(queue="q1", msg_id=2)])
    journal.close()

    lines = list(export_jsonl(tmp_path))

    assert [line["kind"] for line in lines] == ["address", "queue", "queue", "message"]
    assert lines[0] == {"kind": "address", "name": "orders", "routing_types": ["MULTICAST"]}
    assert lines[1]["name"] == "q1"
    assert lines[1]["routing_type"] == "MULTICAST"
    assert lines[3] == {
        "kind": "message",
        "msg_id": 1,
        "address": "orders",
        "durable": True,
        "priority": 4,
        "expiration_ms": 0,
        "first_ts": 0,
        "size": 3,
        "data_base64": "bW1t",
        "queues": [
            {"queue": "q1", "delivery_count": 0, "scheduled_at_ms": 0},
            {"queue": "q2", "delivery_count": 2, "scheduled_at_ms": 0},
        ],
    }
    assert all(json.dumps(line) for line in lines)


def test_export_refuses_a_journal_in_use(tmp_path: Path, journals: list[FileJournal]) -> None:
    journals.append(open_journal(tmp_path))
    with pytest.raises(JournalError, match="is the broker running"):
        list(export_jsonl(tmp_path))


def test_export_of_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="no journal"):
        list(export_jsonl(tmp_path / "nowhere"))


def test_commit_delay_never_holds_up_a_light_load(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    """A lone synchronous sender is answered at fsync speed, whatever the commit delay:
    the delay applies only when commit_delay_bytes or more wait for one pass."""
    journal = open_journal(
        tmp_path, max_segment_bytes=1 << 20, commit_delay_seconds=30, commit_delay_bytes=1 << 20
    )
    journals.append(journal)
    for i in range(3):
        done = threading.Event()
        journal.append([message(i)], sync=True, on_durable=lambda error, d=done: d.set())
        assert done.wait(5), "a small append waited for the commit delay"


def test_commit_delay_lets_a_heavy_backlog_share_one_fsync(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    """Under heavy load the writer waits commit_delay_seconds once, and what arrives in
    the meantime joins the same fsync."""
    gate = threading.Event()
    syncs: list[int] = []

    def slow_fsync(fd: int) -> None:
        syncs.append(fd)
        gate.wait(5)  # hold the first pass so that a backlog builds up behind it

    journal = open_journal(
        tmp_path,
        max_segment_bytes=1 << 24,
        fsync=slow_fsync,
        commit_delay_seconds=0.5,
        commit_delay_bytes=1000,
    )
    journals.append(journal)
    done = threading.Semaphore(0)
    journal.append([message(0)], sync=True, on_durable=lambda error: done.release())
    wait_until(lambda: len(syncs) == 1, timeout=5, message="the first fsync")
    for i in range(1, 11):  # a backlog of 10 appends, >= 1000 bytes
        journal.append([message(i, size=200)], sync=True, on_durable=lambda error: done.release())
    gate.set()
    time.sleep(0.05)  # inside the commit delay: these join the same pass
    for i in range(11, 14):
        journal.append([message(i)], sync=True, on_durable=lambda error: done.release())
    for _ in range(14):
        assert done.acquire(timeout=5)
    assert len(syncs) == 2  # the first pass, then everything else in one group commit


# --- the index: short-lived messages and a lagging index -----------------------------


def test_short_lived_messages_are_those_added_and_fully_acked_in_the_batch() -> None:
    """The rule behind skipping records in the index: only a message whose every
    reference added in the batch is acked in it, and that the index did not know."""
    live = _LiveSet(_ignore_dead)
    live.apply(message(9), None)  # known before the batch
    records: list[Record] = [
        message(1),
        AddRef(queue="q", msg_id=1),
        AckRef(queue="q", msg_id=1),  # gone
        message(2),
        AddRef(queue="q", msg_id=2),
        AddRef(queue="r", msg_id=2),
        AckRef(queue="q", msg_id=2),  # still in r
        message(3),
        AddRef(queue="q", msg_id=3),
        UpdateDeliveryCount(queue="q", msg_id=3, delivery_count=1),
        AckRef(queue="q", msg_id=3),  # gone, its count update with it
        message(4),
        AddRef(queue="q", msg_id=4),
        AckRef(queue="r", msg_id=4),  # wrong queue
        message(5),
        AddRef(queue="q", msg_id=5),
        AddRef(queue="q", msg_id=5),
        AckRef(queue="q", msg_id=5),  # added twice to q: the full rules decide
        message(9),
        AddRef(queue="q", msg_id=9),
        AckRef(queue="q", msg_id=9),  # known
        message(6),  # no reference at all: stays for the full rules (dropped on reopen)
    ]
    assert _short_lived(records, live) == {1, 3}
    with_delete = [*records, DeleteQueue(name="r")]
    assert _short_lived(with_delete, live) == set()


def test_lagging_index_and_compaction_keep_every_live_record(
    tmp_path: Path, journals: list[FileJournal]
) -> None:
    """Random adds to one or two queues (sometimes in the append after the message's),
    acks, count updates and a queue deletion, with
    small segments, compaction at random moments and acks landing many syncs after their
    adds: the compacted journal replays to exactly the state of everything appended."""
    import random

    rng = random.Random(7)
    journal = open_journal(tmp_path, max_segment_bytes=4096, fsync=lambda fd: None)
    journals.append(journal)
    model = JournalState()
    queues = [AddQueue(name=n, address="orders", routing_type=RoutingType.ANYCAST) for n in "qrs"]
    appended: list[Record] = [*queues]
    journal.append(list(queues), sync=True)
    live_refs: list[tuple[str, int]] = []
    for msg_id in range(1, 1500):
        records: list[Record] = [message(msg_id)]
        if rng.random() < 0.1:  # its references in a later batch of the index
            journal.append(records, sync=False)
            appended.extend(records)
            records = []
            journal.flush(timeout=5)
            journal.compact()  # indexes what is synced
        for queue in rng.sample(["q", "r", "s"], rng.choice([1, 1, 2])):
            records.append(AddRef(queue=queue, msg_id=msg_id))
            live_refs.append((queue, msg_id))
        roll = rng.random()
        if live_refs and roll < 0.8:
            queue, acked = live_refs.pop(rng.randrange(max(1, len(live_refs) // 2)))
            records.append(AckRef(queue=queue, msg_id=acked))
        elif live_refs and roll < 0.9:
            queue, counted = rng.choice(live_refs)
            records.append(UpdateDeliveryCount(queue=queue, msg_id=counted, delivery_count=2))
        if msg_id == 1000:
            records.append(DeleteQueue(name="s"))
            live_refs = [ref for ref in live_refs if ref[0] != "s"]
        journal.append(records, sync=rng.random() < 0.7)
        appended.extend(records)
        if rng.random() < 0.02:
            journal.flush(timeout=5)
            journal.compact()
    journal.flush(timeout=5)
    journal.compact()
    journal.close()
    for record in appended:
        model.apply(record)
    replayed = JournalState.of(replay_all(tmp_path))
    assert replayed.messages == model.messages
    assert replayed.refs() == model.refs()
    assert len(segments(tmp_path)) < len(appended) * 60 // 4096  # compaction did reclaim


def test_the_index_skips_messages_acked_within_dozens_of_syncs(
    tmp_path: Path, journals: list[FileJournal], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 (durable path): a consumer ~20 group commits behind its producer (the
    durable benchmark's window) still gets its acks into the index's window, so the
    writer thread indexes none of those messages (with a lag of 8 syncs it indexed them
    all, then killed them again, holding the GIL against the loop)."""
    journal = open_journal(tmp_path, max_segment_bytes=1 << 24, fsync=lambda fd: None)
    journals.append(journal)
    indexed: list[Record] = []
    index_batch = journal._index_batch

    def spy(seg: Any, batch: Any, keep: Any = None) -> None:
        batch = list(batch)
        indexed.extend(record for record, _, _ in batch)
        index_batch(seg, batch, keep)

    monkeypatch.setattr(journal, "_index_batch", spy)
    journal.append([AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)], sync=True)
    for msg_id in range(1, 41):
        records: list[Record] = [message(msg_id), AddRef(queue="q", msg_id=msg_id)]
        if msg_id > 20:
            records.append(AckRef(queue="q", msg_id=msg_id - 20))
        journal.append(records, sync=True)
        journal.flush(timeout=5)  # one sync per append
    journal.compact()  # indexes everything synced
    assert not [r for r in indexed if isinstance(r, AddMessage) and r.msg_id <= 20]
    assert {r.msg_id for r in indexed if isinstance(r, AddMessage)} == set(range(21, 41))


def test_a_message_acked_in_the_next_window_is_never_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: the periodic index takes the older half of its window and leaves the
    newer half to the next, so a message added late in one window and acked early in the
    next is skipped like one acked within a window; B-095: what stays queued is indexed
    and comes back after a reopen, what was acked does not."""
    monkeypatch.setattr(file_journal, "INDEX_EVERY_SYNCS", 4)
    indexed: list[int] = []
    with FileJournal(tmp_path, auto_compact=False) as journal:
        apply = journal._index_batch

        def spy(seg: Any, batch: Any, keep: Any = None) -> None:
            indexed.extend(getattr(record, "msg_id", -1) for record, _, _ in batch)
            apply(seg, batch, keep)

        monkeypatch.setattr(journal, "_index_batch", spy)

        def step(records: list[Record]) -> None:  # one append, one sync
            journal.append(records, sync=True)
            journal.flush()

        step([message(1), AddRef(queue="q", msg_id=1)])  # stays queued
        step([message(2), AddRef(queue="q", msg_id=2)])
        step([message(3), AddRef(queue="q", msg_id=3)])
        step([message(4), AddRef(queue="q", msg_id=4)])  # 4 syncs: 1 and 2 indexed
        assert sorted(set(indexed)) == [1, 2]
        step([AckRef(queue="q", msg_id=4), AckRef(queue="q", msg_id=2)])
        step([message(5), AddRef(queue="q", msg_id=5)])
        step([AckRef(queue="q", msg_id=3)])
        step([message(6), AddRef(queue="q", msg_id=6)])  # 4 syncs: the next window
        assert not {3, 4} & set(indexed)  # added late, acked in the next
        journal.compact()  # indexes everything synced (final)
        assert not {3, 4} & set(indexed)
        assert {1, 2, 5, 6} <= set(indexed)
        assert sorted(ref.msg_id for ref in journal.state().refs()) == [1, 5, 6]
    with FileJournal(tmp_path, auto_compact=False) as reopened:
        assert sorted(ref.msg_id for ref in reopened.state().refs()) == [1, 5, 6]
