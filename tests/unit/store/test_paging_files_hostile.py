"""Page files and directories that are not what the broker wrote (fourth attack pass,
B-151): links and FIFOs under DATA_DIR/paging are never followed, read or waited on."""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path

import pytest

from amqpbroker.amqp import sections
from amqpbroker.core.model import Message
from amqpbroker.core.records import AddMessage
from amqpbroker.protocol import message_of
from amqpbroker.store import recovery
from amqpbroker.store.paging import PageFiles, QueuePages

pytestmark = pytest.mark.timeout(20)  # a FIFO opened for reading blocked the start forever


def _durable(i: int) -> Message:
    data = b"\x00\x53\x77" + sections.encode_value(f"message-{i:05d}")
    message = message_of(sections.scan(data))
    message.msg_id, message.address, message.durable = i + 1, "a", True
    return message


def _files(directory: Path) -> PageFiles:
    return PageFiles(directory, message_of=message_of, page_size_bytes=lambda address: 100_000)


def _write_durable(directory: Path, n: int) -> Path:
    """`n` durable messages paged to queue q of address a, the files closed: the page
    file's path."""
    files = _files(directory)
    files.recover({}, {})
    pages = files.open(address="a", queue="q", durable=True)
    for i in range(n):
        pages.write(_durable(i))
    files.close()
    return max(directory.rglob("*.page"))


def _reopen(directory: Path) -> tuple[list[str], QueuePages, PageFiles]:
    files = _files(directory)
    found = files.recover({"q": "a"}, {})
    return found, files.open(address="a", queue="q", durable=True), files


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "keep.txt").write_text("not the broker's")
    return victim


def test_a_link_as_an_address_directory_is_removed_not_followed(tmp_path: Path) -> None:
    """A link in DATA_DIR/paging was walked as an address directory: every directory in
    the one it named was an unknown queue's, and the start deleted it (rmtree)."""
    victim = _victim(tmp_path)
    paging = tmp_path / "paging"
    paging.mkdir()
    (paging / "evil").symlink_to(victim)
    _files(paging).recover({}, {})
    assert (victim / "sub" / "keep.txt").read_text() == "not the broker's"
    assert not (paging / "evil").is_symlink()


def test_a_link_as_a_known_queue_directory_is_removed_not_used(tmp_path: Path) -> None:
    """A link as queue q's directory made the broker read, append to and delete page
    files wherever it pointed."""
    victim = _victim(tmp_path)
    paging = tmp_path / "paging"
    (paging / "a").mkdir(parents=True)
    (paging / "a" / "q").symlink_to(victim)
    found, pages, files = _reopen(paging)
    assert found == []
    pages.write(_durable(0))
    files.close()
    assert sorted(p.name for p in victim.rglob("*")) == ["keep.txt", "sub"]
    assert not (paging / "a" / "q").is_symlink()


def test_a_fifo_in_a_page_files_place_does_not_hang_the_start(tmp_path: Path) -> None:
    """A FIFO as a page file: the scan's open waited for a writer forever (the broker
    never started). It is an unreadable page file now: skipped, logged, counted."""
    page = _write_durable(tmp_path, 3)
    page.unlink()
    os.mkfifo(page)
    found, pages, files = _reopen(tmp_path)
    assert found == ["q"]
    assert pages.messages == 0
    assert pages.read(max_bytes=-1, max_messages=-1) == []
    files.close()


def test_a_link_as_the_last_page_file_is_not_read_or_truncated_through(tmp_path: Path) -> None:
    """A link as the last page file: its target was read as page frames and, not being
    any, cut as a torn tail: truncated to 0 bytes."""
    page = _write_durable(tmp_path, 3)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious data, not page frames" * 100)
    page.unlink()
    page.symlink_to(victim)
    _, pages, files = _reopen(tmp_path)
    assert victim.read_bytes() == b"precious data, not page frames" * 100
    pages.write(_durable(9))
    files.close()
    assert victim.read_bytes() == b"precious data, not page frames" * 100


def test_names_that_differ_only_in_case_get_directories_that_differ_in_any_case() -> None:
    """On a case-insensitive file system (macOS, Windows) queues `Orders` and `orders`
    shared one page directory: a restart gave each the other's messages."""
    from amqpbroker.store.paging import _safe

    names = ["Orders", "orders", "ORDERS", "a.B", "a.b", "x" * 150 + "Y", "x" * 150 + "y"]
    folded = {_safe(n).casefold() for n in names}
    assert len(folded) == len(names)
    bare = [re.sub("%[0-9A-F]{2}", "", _safe(n)) for n in names[:5]]  # outside the escapes
    assert bare == [b.lower() for b in bare]
    for hostile in ["..", "../x", "a/b", "a\0b", "", ".", "x" * 10_000]:
        safe = _safe(hostile)
        assert "/" not in safe
        assert "\0" not in safe
        assert safe not in ("", ".", "..")
        assert len(safe) <= 201


def test_page_directories_named_before_case_was_escaped_are_renamed_and_recovered(
    tmp_path: Path,
) -> None:
    """Upgrade: the directories of queues with upper-case names, written before upper
    case was escaped, are renamed at the start, their messages kept."""
    from amqpbroker.store.paging import _safe

    files = _files(tmp_path)
    files.recover({}, {})
    pages = files.open(address="Orders", queue="Q1", durable=True)
    for i in range(3):
        message = _durable(i)
        message.address = "Orders"
        pages.write(message)
    files.close()
    new = tmp_path / _safe("Orders") / _safe("Q1")
    old = tmp_path / "Orders" / "Q1"
    old.parent.mkdir()
    new.rename(old)
    new.parent.rmdir()
    files = _files(tmp_path)
    assert files.recover({"Q1": "Orders"}, {}) == ["Q1"]
    pages = files.open(address="Orders", queue="Q1", durable=True)
    assert pages.messages == 3
    assert new.is_dir()
    assert not old.parent.exists()
    files.close()


@pytest.mark.parametrize("priority", [10, 200, 255])
def test_a_page_files_priority_past_9_is_read_as_9(tmp_path: Path, priority: int) -> None:
    """Fifth attack pass (B-013): a page file's priority is a ubyte, and a frame with a
    right checksum and a priority past 9 came back as that Message.priority: the queue's
    depage indexed its ten levels with it (IndexError, the step's messages taken from the
    files and never queued). It is read as a level, 0..9, as a received message's is."""
    page = _write_durable(tmp_path, 1)
    raw = bytearray(page.read_bytes())
    length = struct.unpack_from("<I", raw, 0)[0]
    body = raw[8 : 8 + length]
    # kind, then <BqqqqBH: durable, msg_id, first_ts, expiration, deliver_at, priority
    body[1 + struct.calcsize("<Bqqqq")] = priority
    raw[8 : 8 + length] = body
    struct.pack_into("<I", raw, 4, zlib.crc32(bytes(body)))
    page.write_bytes(bytes(raw))
    _, pages, files = _reopen(tmp_path)
    try:
        assert [m.priority for m in pages.read(max_bytes=-1, max_messages=-1)] == [9]
    finally:
        files.close()


def test_an_old_journal_records_priority_is_read_as_a_level() -> None:
    """Fifth attack pass (B-013): an AddMessage of an older journal (no section scan
    recorded) had its i64 priority set on the message as it was: 77 indexed past the
    queue's levels, -3 picked a level from the end."""
    data = b"\x00\x53\x77" + sections.encode_value("old")
    for stored, level in ((77, 9), (-3, 0), (5, 5)):
        record = AddMessage(msg_id=1, address="a", data=data, priority=stored, header_end=-1)
        assert recovery._message(record, message_of).priority == level


def test_a_page_frame_whose_message_does_not_decode_is_lost_not_raised(tmp_path: Path) -> None:
    """Fifth attack pass (B-151): a frame with a right checksum whose message's sections
    do not decode (a section claiming 4 GiB) raised SectionError out of the read back:
    the messages read before it in that step were taken from the files and never queued,
    and the error went up through the queue's dispatch to the connection whose step asked.
    It is counted lost and logged; the read goes on with the next message."""
    page = _write_durable(tmp_path, 3)
    raw = bytes(page.read_bytes())
    head = struct.Struct("<II")
    length = head.unpack_from(raw, 0)[0]
    second = 8 + length
    length2 = head.unpack_from(raw, second)[0]
    body = raw[second + 8 : second + 8 + length2]
    address_len = struct.unpack_from("<H", body, 1 + struct.calcsize("<BqqqqB"))[0]
    start = 1 + struct.calcsize("<BqqqqBH") + address_len
    bad = body[:start] + b"\x00\x53\x77\xb1\xff\xff\xff\xff"
    rest = raw[second + 8 + length2 :]
    page.write_bytes(raw[:second] + head.pack(len(bad), zlib.crc32(bad)) + bad + rest)
    _, pages, files = _reopen(tmp_path)
    try:
        assert pages.messages == 3
        read = pages.read(max_bytes=-1, max_messages=-1)
        bodies = [sections.decode_first(bytes(m.data), 3)[0] for m in read]
        assert bodies == ["message-00000", "message-00002"]
        assert (pages.lost, pages.messages, pages.size_bytes) == (1, 0, 0)
    finally:
        files.close()


def test_an_old_journal_record_whose_message_does_not_decode_is_kept_as_stored() -> None:
    """Fifth attack pass: an AddMessage of an older journal is scanned again at the
    open, and one with a right checksum whose sections do not decode raised SectionError
    out of the start (a traceback, no file named, no --skip-corrupt-journal way past
    it). It is kept as its bytes, as a record of the current layout is."""
    garbage = b"\x00\x53\x77\xb1\xff\xff\xff\xff"
    record = AddMessage(msg_id=7, address="a", data=garbage, priority=3, header_end=-1)
    message = recovery._message(record, message_of)
    assert (message.data, message.msg_id, message.priority, message.durable) == (
        garbage,
        7,
        3,
        True,
    )
