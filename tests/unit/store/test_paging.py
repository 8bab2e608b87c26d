"""B-151 PAGE (issue 23 item 2): a core broker paging to real page files in a temporary
directory (`store/paging.py`), driven like the adapter drives it (`Harness`)."""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings, QueueConfig, ResourceLimitExceeded, RoutingType
from amqpbroker.core import operations as ops
from amqpbroker.core.model import Message
from amqpbroker.core.outcomes import Accepted, Modified, Rejected
from amqpbroker.core.paging import READ_STEP_MESSAGES
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.records import PageCursor, Record
from amqpbroker.metrics import BrokerCollector, BrokerSnapshot, render
from amqpbroker.protocol import message_of
from amqpbroker.protocol.moves import COPIER
from amqpbroker.store.paging import PageFiles, QueuePages
from tests.support.core_harness import Harness

ACCEPTED = Accepted()
LIMIT = 1_000  # max-size-bytes: ~20 messages of `_amqp`'s size in memory


def _amqp(i: int) -> bytes:
    return bytes(ProtonMessage(body=f"message-{i:05d}" + "x" * 20).encode())  # bytearray


@pytest.fixture
def files(tmp_path: Path) -> Iterator[PageFiles]:
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 2_000)
    files.recover({}, {})
    yield files
    files.close()


def _paging(files: PageFiles, **settings: object) -> Harness:
    # The adapter's copier: moved copies carry their annotations in their bytes, which
    # is what a page file keeps.
    h = Harness({"#": AddressSettings.of(max_size_bytes=LIMIT, **settings)}, copier=COPIER)
    h.broker.enable_paging(files)
    return h


def _decode(data: bytes) -> str:
    message = ProtonMessage()
    message.decode(data)
    return str(message.body)[:13]


def _send(h: Harness, n: int, *, start: int = 0, **kw: object) -> None:
    target = h.producer("q", "queue")
    for i in range(start, start + n):
        h.send(target, _amqp(i), **kw)


def _pages(h: Harness) -> QueuePages:
    pages = h.queue("q").pages
    assert isinstance(pages, QueuePages)
    return pages


def test_a_full_address_pages_and_a_consumer_gets_everything_in_order(files: PageFiles) -> None:
    """B-151 PAGE: past max-size-bytes new messages go to page files (several, by
    page-size-bytes); memory stays near the limit; a consumer then drains all, in order,
    nothing lost or duplicated, and the page files go."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 500)
    queue = h.queue("q")
    pages = _pages(h)
    assert queue.message_count == 500
    assert pages.messages > 400
    assert pages.files > 5
    assert h.broker.memory_bytes <= LIMIT + 100
    c = h.consumer("q", "queue", credit=0)
    got: list[str] = []
    while len(got) < 500:
        h.broker.set_credit(c, 30)
        batch = h.take(c)
        assert batch, f"stalled after {len(got)}"
        assert h.broker.memory_bytes <= 2 * LIMIT + 200  # read back in bounded slices
        for d in batch:
            h.broker.settle(c, d.delivery, ACCEPTED)
        got += [_decode(d.message.data) for d in batch]
    assert got == [f"message-{i:05d}" for i in range(500)]
    assert queue.message_count == 0
    assert pages.messages == 0
    assert len(list(pages.directory.glob("*.page"))) <= 1  # read files are deleted


def test_new_messages_follow_the_paged_ones_until_they_are_read(files: PageFiles) -> None:
    """B-151/B-014: once a queue has paged messages, later ones queue behind them even
    when memory has room again."""
    h = _paging(files)
    _send(h, 60)
    c = h.consumer("q", "queue", credit=5)
    for d in h.take(c):
        h.broker.settle(c, d.delivery, ACCEPTED)
    _send(h, 1, start=60)
    h.broker.set_credit(c, 100)
    rest = [_decode(d.message.data) for d in h.take(c)]
    assert rest == [f"message-{i:05d}" for i in range(5, 61)]


def test_a_paged_message_that_expired_goes_to_the_expiry_address(files: PageFiles) -> None:
    """B-084/B-085 with paging: read back after its expiry, it is never delivered and is
    moved to the expiry address."""
    h = _paging(files, expiry_address="EXP", max_read_page_bytes=LIMIT)
    h.producer("EXP", "queue")
    _send(h, 40, ttl_ms=1_000)
    assert _pages(h).messages > 0
    h.advance(2_000)
    c = h.consumer("q", "queue", credit=100)
    assert h.take(c) == []
    assert h.queue("q").message_count == 0
    assert h.queue("q").counters.expired == 40
    assert h.queue("EXP").message_count == 40


def test_paged_messages_are_redelivered_and_dead_lettered_as_others(files: PageFiles) -> None:
    """B-060/B-046 with paging: delivery counts and dead-lettering of read-back ones."""
    h = _paging(files, dead_letter_address="DLA", max_delivery_attempts=2)
    h.producer("DLA", "queue")
    _send(h, 60)
    c = h.consumer("q", "queue", credit=100)
    first = h.take(c)
    assert len(first) >= 20
    last = first[-1]  # a paged one read back
    h.broker.settle(c, last.delivery, Rejected())
    assert h.queue("DLA").message_count == 1
    assert _decode(last.message.data) == _decode(h.queue("DLA").refs()[0].message.data)


def test_browse_count_and_purge_see_paged_messages(files: PageFiles) -> None:
    """B-161 with paging: browse lists in-memory then paged messages in order; count and
    purge include the paged ones; the page files are emptied."""
    h = _paging(files)
    _send(h, 100)
    listed = ops.browse(h.broker, "q", limit=1_000)
    assert [_decode(r.message.data) for r in listed] == [f"message-{i:05d}" for i in range(100)]
    assert ops.count(h.broker, "q") == 100
    assert [r.message.msg_id for r in ops.browse(h.broker, "q", offset=90, limit=3)] == [
        r.message.msg_id for r in listed[90:93]
    ]
    assert ops.purge(h.broker, "q") == 100
    assert h.queue("q").message_count == 0
    assert h.queue("q").counters.killed == 100
    c = h.consumer("q", "queue", credit=100)
    assert h.take(c) == []


@pytest.mark.parametrize("operation", ["purge", "move"])
def test_filtered_operations_take_paged_messages_and_keep_the_rest(
    files: PageFiles, operation: str
) -> None:
    """B-161 with paging: a filtered purge or a move by ids takes paged messages out of
    the page files; the others stay, in order."""
    h = _paging(files)
    h.producer("other", "queue")
    _send(h, 100)
    ids = [r.message.msg_id for r in ops.browse(h.broker, "q", limit=1_000)]
    doomed = set(ids[50::2])  # every other paged one
    if operation == "purge":
        assert ops.purge(h.broker, "q", ids=doomed) == len(doomed)
    else:
        assert ops.move(h.broker, "q", to_queue="other", ids=doomed) == len(doomed)
        assert h.queue("other").message_count == len(doomed)
    assert h.queue("q").message_count == 100 - len(doomed)
    c = h.consumer("q", "queue", credit=200)
    got = [d.message.msg_id for d in h.take(c)]
    assert got == [i for i in ids if i not in doomed]


def test_a_last_value_queue_keeps_replacing_instead_of_paging(files: PageFiles) -> None:
    """B-120 with B-151 PAGE: a last-value queue on a full address is not paged (its
    replacement works on what it holds in memory): one message per key stays."""
    h = _paging(files, default_last_value_queue=True)
    target = h.producer("q", "queue")
    for i in range(200):
        h.send(target, _amqp(i), props={"_AMQ_LVQ_NAME": f"k{i % 50}"})  # 50 x 45 B > LIMIT
    queue = h.queue("q")
    assert queue.pages is None
    assert queue.message_count == 50


def test_a_page_file_that_cannot_be_written_refuses_the_message(
    files: PageFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-151 PAGE on a full disk: the producer gets resource-limit-exceeded (its
    connection is not closed as by an internal error); nothing is counted."""
    from amqpbroker.core import ResourceLimitExceeded

    h = _paging(files)
    _send(h, 60)
    pages = _pages(h)
    before = pages.messages

    def disk_full(frame: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pages, "_append", disk_full)
    with pytest.raises(ResourceLimitExceeded, match="No space left"):
        _send(h, 1, start=60)
    assert pages.messages == before


def _durable(i: int, msg_id: int | None = None) -> Message:
    """Message `i` of `_amqp`, durable, for address a, as the broker would page it."""
    message = message_of(sections.scan(_amqp(i)))
    message.msg_id, message.address, message.durable = (
        i + 1 if msg_id is None else msg_id,
        "a",
        True,
    )
    return message


def _fill(pages: QueuePages, numbers: range) -> None:
    for i in numbers:
        pages.write(_durable(i))


def _write_durable(directory: Path, n: int) -> Path:
    """`n` durable messages paged to queue q of address a; the files closed (a crash
    after the flush). The last page file's path."""
    files = PageFiles(directory, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({}, {})
    pages = files.open(address="a", queue="q", durable=True)
    _fill(pages, range(n))
    files.close()
    return max(directory.rglob("*.page"))


def _reopen(directory: Path) -> QueuePages:
    files = PageFiles(directory, message_of=message_of, page_size_bytes=lambda address: 100_000)
    assert files.recover({"q": "a"}, {}) == ["q"]
    return files.open(address="a", queue="q", durable=True)


@pytest.mark.parametrize(
    "tail",
    [
        b"\0" * 4096,  # zero-filled: the file grew, its data never reached the disk
        b"\0" * 8,
        # frames whose checksum matches but that no writer wrote: an unknown kind, a
        # message head cut short, an address longer than the frame, a short marker
        *(
            struct.pack("<II", len(body), zlib.crc32(body)) + body
            for body in (b"\x09", b"\x01\x01\x02", b"\x01" + b"\0" * 34 + b"\xff\xff", b"\x02")
        ),
    ],
    ids=["zeros-4k", "zeros-8", "unknown-kind", "short-head", "long-address", "short-marker"],
)
def test_a_page_tail_that_is_zeros_or_unsound_is_cut_and_the_rest_recovered(
    tmp_path: Path, tail: bytes
) -> None:
    """Issue 23 item 2 (torn page tail, B-151): after a power loss a page file can end
    in zeros (its size grew before its data was written), and a zero-length frame has
    the checksum of nothing, so it used to pass and crash the start-up scan with an
    IndexError. Such a tail, or any checksummed frame no writer produced, is cut like a
    torn one; the sound messages before it come back in order."""
    page = _write_durable(tmp_path, 3)
    sound = page.stat().st_size
    with open(page, "ab") as f:
        f.write(tail)
    pages = _reopen(tmp_path)
    assert page.stat().st_size == sound
    assert pages.messages == 3
    got = pages.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(3)]


@pytest.mark.parametrize("length", [0x7FFFFFFF, 1 << 30, 100_000])
def test_a_frame_length_past_the_file_end_is_not_allocated(tmp_path: Path, length: int) -> None:
    """Issue 15 attack (B-151, page files crafted or damaged): a frame whose length runs
    past the end of its file was read with `f.read(length)`, which allocates `length`
    bytes before it reads: 2 GiB for one lying frame (a MemoryError out of the start
    under an address-space limit). It is a torn tail, cut without reading it."""
    import tracemalloc

    page = _write_durable(tmp_path, 3)
    sound = page.stat().st_size
    with open(page, "ab") as f:
        f.write(struct.pack("<II", length, 0) + b"\x01" * 64)
    tracemalloc.start()
    try:
        pages = _reopen(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024
    assert page.stat().st_size == sound
    assert pages.messages == 3


def test_long_names_whose_crc32_collide_page_to_different_directories(
    files: PageFiles,
) -> None:
    """Issue 23 item 1 (hostile names, B-151): a name too long for a file name is cut
    and made unique by a digest; with a crc32 two queue names a peer chose (found by
    a birthday search) mapped to one directory and shared page files."""
    one, two = "a" * 200 + "29685295", "a" * 200 + "32060020"
    assert zlib.crc32(one.encode()) == zlib.crc32(two.encode())
    first = files.open(address="a", queue=one, durable=False)
    second = files.open(address="a", queue=two, durable=False)
    assert first.directory != second.directory
    assert len(first.directory.name.encode()) <= 255


def _fsynced(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The paths of the files `os.fsync` is called on from now on."""
    import os

    synced: set[str] = set()
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_every_page_file_with_durable_messages_is_fsynced_when_the_step_is_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 2 (durable paged messages survive a crash, B-151): a write that
    rolls to the next page file closed the previous one without an fsync, and the
    step's flush synced only the file still open, so the durable messages at the end
    of every rolled page file could be lost in a power failure after their accept."""
    synced = _fsynced(monkeypatch)
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 300)
    files.recover({}, {})
    pages = files.open(address="a", queue="q", durable=True)
    _fill(pages, range(10))
    files.flush()
    on_disk = {str(p) for p in tmp_path.rglob("*.page")}
    assert len(on_disk) > 2
    assert synced == on_disk
    files.close()


def _open_page_files(directory: Path) -> int:
    import os

    fds = Path("/proc/self/fd")
    links = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            links.append(os.readlink(fd))
    return sum(1 for link in links if link.startswith(str(directory)))


def test_many_paging_queues_hold_a_bounded_number_of_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 3 (many queues paging at once): each paging queue kept its page
    file open for writing, so 2,000 paging queues (a peer can auto-create them) held
    2,000 descriptors and starved connections and the journal of them. At most
    `max_writers` stay open; a queue whose file was closed opens it again, its durable
    messages synced first, and every queue reads back all it paged, in order."""
    synced = _fsynced(monkeypatch)
    files = PageFiles(
        tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000, max_writers=3
    )
    files.recover({}, {})
    queues = [files.open(address="a", queue=f"q{n}", durable=True) for n in range(20)]
    for i in range(5):
        for n, pages in enumerate(queues):
            pages.write(_durable(i, 100 * n + i))
            assert _open_page_files(tmp_path) <= 3
    assert len(synced) == 20  # each closed with its durable messages synced
    for pages in queues:
        got = pages.read(max_bytes=-1, max_messages=-1)
        assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(5)]
    files.close()
    assert _open_page_files(tmp_path) == 0


def test_a_removal_cut_short_by_a_crash_does_not_swallow_later_messages(tmp_path: Path) -> None:
    """Issue 23 items 2 and 3 (crash while a management purge/move/retry with a filter
    rewrites paged messages, B-151): removing appends a marker and copies of the kept
    messages; a crash while the copies are written (a long removal takes seconds)
    leaves fewer copies than the marker announces. The cursor was not journaled past
    the marker, so the reader meets it and skipped the announced number of frames:
    the copies there, then the messages sent after the restart, silently lost. The
    scan at open now cuts an unfinished removal off (it never happened)."""
    page = _write_durable(tmp_path, 5)
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({"q": "a"}, {"q": (1, 0)})
    pages = files.open(address="a", queue="q", durable=True)
    before = page.stat().st_size
    pages.remove({1})  # marker(4), then four copies
    files.close()
    frame = (page.stat().st_size - before - _FRAME_MARKER) // 4
    with open(page, "r+b") as f:  # the crash: one copy and a part of the next on disk
        f.truncate(before + _FRAME_MARKER + frame + frame // 2)
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({"q": "a"}, {"q": (1, 0)})
    pages = files.open(address="a", queue="q", durable=True)
    assert pages.messages == 5
    _fill(pages, range(5, 8))
    got = pages.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(8)]
    files.close()


_FRAME_MARKER = 8 + 1 + 8  # frame head, kind, copies


def test_page_files_deleted_by_hand_do_not_strand_the_queue(tmp_path: Path) -> None:
    """Issue 23 item 2 (a deleted page file, B-151): an operator removed a queue's page
    files but the journal kept its cursor, some bytes into page 1. New messages went to
    a new page 1 from byte 0 and were read from the cursor's offset: nothing at first,
    then from the middle of a frame, which ends the reading; the queue counted
    messages it could never deliver. Writing starts a page after the cursor's."""
    _write_durable(tmp_path, 3)
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({"q": "a"}, {})
    pages = files.open(address="a", queue="q", durable=True)
    assert len(pages.read(max_bytes=-1, max_messages=2)) == 2
    cursor = pages.position
    files.close()
    for page in tmp_path.rglob("*.page"):
        page.unlink()
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({"q": "a"}, {"q": cursor})
    pages = files.open(address="a", queue="q", durable=True)
    _fill(pages, range(3, 6))
    assert pages.messages == 3
    got = pages.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(3, 6)]
    files.close()


@contextlib.contextmanager
def _disk_full_past(size: int) -> Iterator[None]:
    """Files of this process cannot grow past `size` bytes meanwhile (RLIMIT_FSIZE, with
    SIGXFSZ ignored: a write is cut short, then fails, as on a full disk)."""
    import resource
    import signal

    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)


def test_a_disk_full_mid_frame_refuses_that_message_and_loses_no_later_one(
    tmp_path: Path,
) -> None:
    """Issue 23 item 2 (disk full while paging, B-151): page writes were buffered, so
    a full disk surfaced later, in a read or the step's flush (an exception out of
    the core), after a part of a frame had reached the file; the frames written once
    there was room again followed that torn one and were cut off with it at the next
    start. Now the message that does not fit is refused when it is written, the part
    of it on disk is taken back, and everything accepted before and after comes back
    in order, also after a restart."""
    from amqpbroker.core import ResourceLimitExceeded

    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({}, {})
    pages = files.open(address="a", queue="q", durable=True)
    frame = 8 + 1 + 36 + len("a") + len(_amqp(0))  # `_encode`'s layout
    accepted: list[str] = []
    refused = 0
    for i in range(10):
        message = _durable(i)
        try:
            if 4 <= i < 7:
                with _disk_full_past(4 * frame + frame // 2):  # four frames and a part
                    pages.write(message)
            else:
                pages.write(message)
        except ResourceLimitExceeded:
            refused += 1
            continue
        accepted.append(f"message-{i:05d}")
        files.flush()
    assert refused == 3
    assert pages.messages == len(accepted) == 7
    assert [_decode(m.data) for m in pages.browse()] == accepted
    files.close()
    reopened = _reopen(tmp_path)
    got = reopened.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == accepted


def test_a_removal_the_disk_cannot_hold_is_taken_back_whole(tmp_path: Path) -> None:
    """Issue 23 items 2-3 (disk full during a filtered purge/move/retry, B-151): the
    removal's marker announced four copies, the disk took one, and the copies' error
    left the marker in place: the next read skipped four frames, the one copy and then
    three messages sent afterwards. A removal that fails is taken back whole (the
    messages stay as they were) and nothing written later is lost."""
    page = _write_durable(tmp_path, 5)
    pages = _reopen(tmp_path)
    frame = page.stat().st_size // 5
    with pytest.raises(OSError, match="too large"), _disk_full_past(6 * frame):
        pages.remove({1})
    _fill(pages, range(5, 8))
    assert pages.messages == 8
    got = pages.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(8)]
    pages.close()


def test_stray_files_in_a_page_directory_do_not_stop_the_start(tmp_path: Path) -> None:
    """Issue 23 item 2 (a careless operator, B-151): page numbers were read from any
    `*.page` file whose stem `isdigit()`, which holds for "²" and other Unicode digits
    that `int()` refuses: a stray file stopped the broker at start. Only ASCII page
    numbers count; the others are left alone."""
    _write_durable(tmp_path, 3)
    directory = next(tmp_path.rglob("*.page")).parent
    (directory / "².page").write_bytes(b"stray")
    (directory / "notes.page").write_bytes(b"stray")
    pages = _reopen(tmp_path)
    assert pages.messages == 3


def test_a_deleted_queues_late_release_spares_the_files_of_its_namesake(tmp_path: Path) -> None:
    """Issue 23 item 3 (delete a queue while it pages, B-151): page files go once the
    journaled cursor is on disk (`release`, a callback after the journal's fsync). A
    queue deleted and created again (auto-create) in that window pages into the same
    directory from page 1, and the old queue's late release deleted the new one's page
    files. A destroyed queue's release does nothing."""
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 300)
    files.recover({}, {})

    old = files.open(address="a", queue="q", durable=True)
    _fill(old, range(10))
    old.read(max_bytes=-1, max_messages=-1)
    position = old.position  # journaled; its release waits for the fsync
    old.destroy()
    new = files.open(address="a", queue="q", durable=True)
    _fill(new, range(10))
    old.release(position)
    got = new.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(10)]
    files.close()


def _drain(h: Harness, consumer: object) -> list[str]:
    """Accept everything the queue gives `consumer`, 20 at a time."""
    got: list[str] = []
    while True:
        h.broker.set_credit(consumer, 20)  # type: ignore[arg-type]
        batch = h.take(consumer)  # type: ignore[arg-type]
        if not batch:
            return got
        for d in batch:
            h.broker.settle(consumer, d.delivery, ACCEPTED)  # type: ignore[arg-type]
            got.append(_decode(d.message.data))


def _browse_all(h: Harness, browser: object, *, credit: int) -> list[str]:
    """Give a browser `credit` at a time until it gets nothing more."""
    seen: list[str] = []
    while True:
        h.broker.set_credit(browser, credit)  # type: ignore[arg-type]
        batch = h.take(browser)  # type: ignore[arg-type]
        if not batch:
            return seen
        seen += [_decode(d.message.data) for d in batch]


def test_a_browser_sees_the_paged_messages_in_order_and_a_consumer_still_gets_all(
    files: PageFiles,
) -> None:
    """B-031 over B-151 (issue 23, browsers): a browser with little credit sees every
    message of a paging queue, the in-memory ones then the paged ones, in order, once;
    nothing is taken (counts unchanged), and a consumer then gets all of them."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 300)
    assert _pages(h).messages > 250
    browser = h.consumer("q", "queue", credit=0, browse=True)
    assert _browse_all(h, browser, credit=7) == [f"message-{i:05d}" for i in range(300)]
    assert h.queue("q").message_count == 300
    assert h.broker.memory_bytes <= 2 * LIMIT  # read as credit allows, never all held
    assert _drain(h, h.consumer("q", "queue", credit=0)) == [f"message-{i:05d}" for i in range(300)]


def test_a_browser_inside_the_pages_is_not_sent_again_what_is_read_back(
    files: PageFiles,
) -> None:
    """B-031 over B-151: while a browser is part-way through the page files, a consumer
    drains the queue (the paged messages it has seen come back into memory with new
    places) and new messages arrive: the browser goes on with the next one, no repeats,
    no gaps."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 120)
    browser = h.consumer("q", "queue", credit=60, browse=True)
    first = [_decode(d.message.data) for d in h.take(browser)]
    assert first == [f"message-{i:05d}" for i in range(60)]
    c = h.consumer("q", "queue", credit=0)
    taken: list[str] = []
    for _ in range(4):  # read back, across the browser's place, in slices
        h.broker.set_credit(c, 20)
        for d in h.take(c):
            taken.append(_decode(d.message.data))
            h.broker.settle(c, d.delivery, ACCEPTED)
    assert taken == [f"message-{i:05d}" for i in range(80)]
    _send(h, 20, start=120)
    rest = _browse_all(h, browser, credit=9)
    assert rest == [f"message-{i:05d}" for i in range(80, 140)]


@pytest.mark.parametrize("operation", ["purge", "move"])
def test_a_browser_inside_the_pages_goes_on_after_paged_messages_are_removed(
    files: PageFiles, operation: str
) -> None:
    """B-031 over B-151 + B-161: a filtered removal of paged messages rewrites the page
    files; a browser part-way through them goes on after the last one it saw."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    h.producer("other", "queue")
    _send(h, 100)
    ids = [r.message.msg_id for r in ops.browse(h.broker, "q", limit=1_000)]
    browser = h.consumer("q", "queue", credit=70, browse=True)
    assert len(h.take(browser)) == 70
    assert _pages(h).messages > 70  # it is inside the page files
    doomed = set(ids[40:100:3])  # paged ones on both sides of the browser's place
    if operation == "purge":
        assert ops.purge(h.broker, "q", ids=doomed) == len(doomed)
    else:
        assert ops.move(h.broker, "q", to_queue="other", ids=doomed) == len(doomed)
    expected = [f"message-{i:05d}" for i in range(70, 100) if ids[i] not in doomed]
    assert _browse_all(h, browser, credit=4) == expected


def _run_due(h: Harness) -> None:
    """Tick while the broker has work due now, as the server's timer does (bounded)."""
    for _ in range(1_000):
        due = h.broker.next_deadline_ms()
        if due is None or due > h.clock.now_ms():
            return
        h.broker.tick()
    raise AssertionError("the broker keeps having work due")


def test_paged_messages_that_expire_without_a_consumer_go_to_the_expiry_address(
    files: PageFiles,
) -> None:
    """B-084/B-085 over B-151 (issue 23): no consumer; paged messages whose TTL passes
    are read back and moved to the expiry address as they are read (a step per loop
    turn), with the B-090 annotations and an `expired` event each, so that the queue's
    count and the page files do not keep them; never delivered afterwards."""
    h = _paging(files, expiry_address="EXP", max_read_page_bytes=LIMIT)
    h.producer("EXP", "queue")
    _send(h, 2_000, ttl_ms=1_000)
    pages = _pages(h)
    assert pages.messages > 1_900
    h.broker.emitter.take()
    h.advance(999)
    _run_due(h)
    assert h.queue("q").message_count == 2_000  # not yet
    h.advance(29_001)  # the expiry scan (message-expiry-scan-period 30 s) is due
    _run_due(h)
    queue = h.queue("q")
    assert (queue.message_count, pages.messages, queue.counters.expired) == (0, 0, 2_000)
    assert h.queue("EXP").message_count == 2_000
    moved = h.queue("EXP").pages
    assert moved is not None  # the expiry address is full too: the copies page there
    copy = next(iter(moved.browse()))
    assert copy.get_annotations()["x-opt-ORIG-QUEUE"] == "q"
    assert copy.get_annotations()["x-opt-ACTUAL-EXPIRY"] == h.clock.now_ms()
    events = [e for e in h.broker.emitter.take() if e.event == "expired"]
    assert len(events) == 2_000
    assert {(e.queue, e.reason, e.target_address) for e in events} == {("q", "moved", "EXP")}
    c = h.consumer("q", "queue", credit=100)
    assert h.take(c) == []


def test_an_expired_paged_message_is_never_delivered_nor_browsed(files: PageFiles) -> None:
    """B-084 over B-151: a consumer and a browser attached after the TTL of every other
    paged message passed (before any expiry scan) get only the live ones, in order; the
    expired ones are at the expiry address."""
    h = _paging(files, expiry_address="EXP", max_read_page_bytes=LIMIT)
    h.producer("EXP", "queue")
    target = h.producer("q", "queue")
    for i in range(300):
        h.send(target, _amqp(i), ttl_ms=1_000 if i % 2 else None)
    h.clock.advance(1_000)  # no tick: dispatch and the browser meet them first
    live = [f"message-{i:05d}" for i in range(0, 300, 2)]
    browser = h.consumer("q", "queue", credit=0, browse=True)
    assert _browse_all(h, browser, credit=11) == live
    assert _drain(h, h.consumer("q", "queue", credit=0)) == live
    assert h.queue("q").counters.expired == 150
    assert h.queue("EXP").message_count == 150


def test_paged_expired_messages_behind_a_live_head_wait_to_be_read_back(
    files: PageFiles,
) -> None:
    """B-084 over B-151, the documented limit (docs/decisions.md, as Artemis): with no
    consumer, expired paged messages behind max-read-page-bytes of live ones are found
    when they are read back: counted until then, never delivered."""
    h = _paging(files, expiry_address="EXP", max_read_page_bytes=LIMIT)
    h.producer("EXP", "queue")
    _send(h, 100)  # live: more than memory takes back
    _send(h, 100, start=100, ttl_ms=1_000)
    h.advance(30_000)
    _run_due(h)
    assert h.queue("q").counters.expired < 100
    assert h.queue("q").message_count == 200 - h.queue("q").counters.expired
    assert _drain(h, h.consumer("q", "queue", credit=0)) == [f"message-{i:05d}" for i in range(100)]
    assert h.queue("q").counters.expired == 100
    assert h.queue("EXP").message_count == 100


def test_the_earliest_paged_expiration_is_known_after_writes_a_removal_and_a_restart(
    tmp_path: Path,
) -> None:
    """B-084 over B-151: `expiring_ms`, when the queue must look for expired paged
    messages, is the earliest expiration written, exact again after a removal rewrote
    the files and after a restart's scan, and 0 once nothing paged expires."""
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({}, {})
    pages = files.open(address="a", queue="q", durable=True)
    expirations = [0, 9_000, 5_000, 0, 7_000]
    for i, expiration in enumerate(expirations):
        message = _durable(i)
        message.expiration_ms = expiration
        pages.write(message)
    assert pages.expiring_ms == 5_000
    pages.remove({3})  # msg_id 3: message 2, expiring at 5 s
    assert pages.expiring_ms == 7_000
    cursor = pages.position  # journaled with the removal
    files.close()
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({"q": "a"}, {"q": cursor})
    pages = files.open(address="a", queue="q", durable=True)
    assert pages.expiring_ms == 7_000
    assert len(pages.read(max_bytes=-1, max_messages=-1)) == 4
    assert pages.expiring_ms == 0
    files.close()


def test_a_read_back_takes_a_step_not_max_read_page_bytes_at_once(files: PageFiles) -> None:
    """Issue 23 (page reads on the event loop): with the default max-read-page-bytes
    (20 MiB) a consumer's first dispatch read every paged message back at once (~0.2 s
    of the loop for 20 MiB of 1 KiB messages); now one step per read, and a consumer
    still gets everything in order, a step after another."""
    h = _paging(files)
    _send(h, 3_000)
    queue = h.queue("q")
    in_memory = queue.memory_count
    c = h.consumer("q", "queue", credit=1)
    assert queue.memory_count <= in_memory + READ_STEP_MESSAGES
    assert _pages(h).messages >= 3_000 - in_memory - READ_STEP_MESSAGES
    assert _pages(h).messages > 2_000  # not the whole backlog
    h.broker.settle(c, h.take(c)[0].delivery, ACCEPTED)
    assert _drain(h, c) == [f"message-{i:05d}" for i in range(1, 3_000)]


def test_looking_for_expired_paged_messages_pulls_at_most_a_step_into_memory(
    files: PageFiles,
) -> None:
    """B-151 memory bound with B-084: a queue nobody drains, whose earliest paged
    message expired with live ones behind it, reads back one step when its expiry
    check runs (that one goes to the expiry address), not max-read-page-bytes (default
    20 MiB) per queue."""
    h = _paging(files, expiry_address="EXP")
    h.producer("EXP", "queue")
    _send(h, 30)
    queue = h.queue("q")
    in_memory = queue.memory_count
    _send(h, 1, start=30, ttl_ms=1_000)
    _send(h, 2_000, start=31, ttl_ms=100_000)
    h.advance(1_000)
    _run_due(h)
    assert queue.counters.expired == 1
    assert queue.memory_count <= in_memory + READ_STEP_MESSAGES
    assert _pages(h).messages > 1_500


def test_a_page_file_a_browser_cannot_read_ends_its_browse_not_the_broker(
    files: PageFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """B-031 over B-151 (issue 23, browsers read on into the page files): a page file
    that cannot be opened (an operator's mistake: a directory in its place, an I/O
    error) raised out of `set_credit` in the middle of a dispatch. Now the browser sees
    the paged messages up to it, the error is logged, nothing is taken or moved (count
    and cursor unchanged), and the management browse answers too."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 200)
    pages = _pages(h)
    browser = h.consumer("q", "queue", credit=70, browse=True)
    assert len(h.take(browser)) == 70
    cursor = pages.position
    doomed = sorted(pages.directory.glob("*.page"))[-2]
    lost = {name for _, _, name in _frames_of(pages, doomed)}
    doomed.unlink()
    doomed.mkdir()
    seen = _browse_all(h, browser, credit=9)
    # h-attack: the rest of the damaged file is skipped, as the read back skips it
    assert seen == [f"message-{i:05d}" for i in range(70, 200) if f"message-{i:05d}" not in lost]
    assert "cannot read" in caplog.text
    assert len(ops.browse(h.broker, "q", limit=1_000)) == 200 - len(lost)
    assert h.queue("q").message_count == 200
    assert pages.position == cursor


def _tagged(i: int, tag: str) -> bytes:
    return bytes(ProtonMessage(body=f"message-{i:05d}" + "x" * 20, properties={"k": tag}).encode())


@pytest.mark.parametrize("drain", [False, True])
def test_a_browser_whose_selector_matches_nothing_walks_a_step_per_loop_turn(
    files: PageFiles, drain: bool
) -> None:
    """B-031 over B-151 (issue 23 defect 1): a browser whose selector matches none of a
    paged backlog walked every page file in one dispatch (a 10 GiB backlog would hold
    the loop). Now it walks at most a read step per dispatch and goes on next loop turn
    (`tick`), and sees exactly what it saw before: the matching messages behind the
    backlog, in order, once; a drain completes only once the walk has ended."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    target = h.producer("q", "queue")
    n = 4 * READ_STEP_MESSAGES
    for i in range(n + 3):
        tag = "yes" if i >= n else "no"
        h.send(target, _tagged(i, tag), props={"k": tag})
    assert _pages(h).messages > 3 * READ_STEP_MESSAGES
    browser = h.consumer("q", "queue", credit=0, browse=True, selector="k = 'yes'")
    h.broker.set_credit(browser, 10, drain=drain)
    h._collect()
    mark = next(c for c in h.queue("q").consumers if c.browser).page_mark
    assert mark is not None
    assert mark.seen <= READ_STEP_MESSAGES  # a step, not the backlog
    assert mark.walking
    assert h.take(browser) == []
    assert browser not in h.drained  # a drain waits for the walk
    turns = 0
    while (due := h.broker.next_deadline_ms()) is not None and due <= h.clock.now_ms():
        before = mark.seen
        h.broker.tick()
        h._collect()
        assert mark.seen - before <= READ_STEP_MESSAGES
        turns += 1
        assert turns < 100
    assert turns >= 3
    got = [_decode(d.message.data) for d in h.take(browser)]
    assert got == [f"message-{i:05d}" for i in range(n, n + 3)]
    assert (browser in h.drained) is drain
    assert h.queue("q").message_count == n + 3  # nothing taken


@pytest.mark.parametrize("expired_while_down", [True, False])
def test_recovered_paged_messages_expire_when_due_not_at_the_first_expiry_scan(
    tmp_path: Path, expired_while_down: bool
) -> None:
    """B-084/B-085 over B-151 + B-095 (issue 23 defect 2): page files a restart finds
    hold messages whose TTL passed while the broker was down (or passes soon after):
    they waited for the first periodic expiry scan (never, with no other expiring
    message). Now `enable_paging` arms the page expiry for the earliest one: they go to
    the expiry address as soon as due, with no consumer and no scan."""
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 2_000)
    files.recover({}, {})
    pages = files.open(address="q", queue="q", durable=True)
    h = Harness({"#": AddressSettings.of(max_size_bytes=LIMIT, expiry_address="EXP")})
    due_ms = h.clock.now_ms() + (-1 if expired_while_down else 5_000)
    for i in range(50):
        message = _durable(i)
        message.address, message.expiration_ms = "q", due_ms
        pages.write(message)
    files.close()
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 2_000)
    h.producer("EXP", "queue")
    h.producer("q", "queue")
    h.broker.enable_paging(files, paged=tuple(files.recover({"q": "q"}, {})))
    queue = h.queue("q")
    assert queue.message_count == 50
    assert h.broker.next_deadline_ms() == due_ms  # armed at enable_paging
    if not expired_while_down:
        _run_due(h)
        assert queue.message_count == 50  # not yet
        h.clock.advance(5_000)
    _run_due(h)
    assert (queue.message_count, queue.counters.expired) == (0, 50)
    assert h.queue("EXP").message_count == 50
    files.close()


def _frames_of(pages: QueuePages, path: Path) -> list[tuple[int, int, str]]:
    """(start, end, message) of each message frame in the page file at `path`."""
    out, start = [], 0
    for frame in pages._file_frames(int(path.stem), 0, -1):
        if frame.kind == 1:
            out.append((start, frame.end[1], _decode(pages._message(frame).data)))
        start = frame.end[1]
    return out


@pytest.mark.parametrize("damage", ["unreadable", "corrupt-middle", "torn-tail"])
def test_a_damaged_page_file_loses_only_its_part_counted_and_the_queue_goes_on(
    files: PageFiles, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """B-151 PAGE (issue 23 defect 3): a consumer's read back from a page file that
    cannot be read raised out of dispatch (`set_credit`), and a corrupt frame in the
    middle of a file silently dropped the rest of it while the queue kept counting it.
    Now, as the journal handles damage: the torn tail of the last file is cut (a
    warning), other damage skips the rest of that file (an error); the log names the
    file and the byte; what is lost is counted (`lost`) and out of the queue's count;
    the consumer gets every other message in order, and new ones after."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 200)
    pages = _pages(h)
    paths = sorted(pages.directory.glob("*.page"))
    assert len(paths) > 4
    if damage == "unreadable":  # an operator's mistake or an I/O error
        path, byte = paths[2], 0
        lost = [name for _, _, name in _frames_of(pages, path)]
        path.unlink()
        path.mkdir()
    elif damage == "corrupt-middle":
        path = paths[2]
        frames = _frames_of(pages, path)
        byte = frames[3][0]
        lost = [name for _, _, name in frames[3:]]
        data = bytearray(path.read_bytes())
        data[byte + 12] ^= 0xFF  # inside the body: the checksum does not match
        path.write_bytes(bytes(data))
    else:
        path = paths[-1]
        frames = _frames_of(pages, path)
        byte = frames[-1][0]
        lost = [frames[-1][2]]
        os.truncate(path, frames[-1][1] - 5)
    assert lost
    c = h.consumer("q", "queue", credit=0)
    got = _drain(h, c)  # raised IsADirectoryError for "unreadable"
    assert got == [f"message-{i:05d}" for i in range(200) if f"message-{i:05d}" not in lost]
    assert h.queue("q").message_count == 0  # counted 'lost' ones forever
    assert (pages.messages, pages.size_bytes) == (0, 0)
    assert pages.lost == len(lost)
    assert f"{path.name} at byte {byte}" in caplog.text
    level = "WARNING" if damage == "torn-tail" else "ERROR"
    assert any(r.levelname == level and path.name in r.getMessage() for r in caplog.records)
    _send(h, 60, start=200)  # paging and reading back go on
    assert _drain(h, c) == [f"message-{i:05d}" for i in range(200, 260)]


def test_a_consumer_selector_takes_paged_messages_as_in_memory_ones(files: PageFiles) -> None:
    """B-151 PAGE with selectors (issue 23 audit: "selectors/filters behave the same for
    paged messages"): on a queue that pages most of a mixed backlog, a consumer with a
    selector gets exactly the matching messages, in order, read back from the page
    files; a plain consumer then gets the others, in order."""
    h = _paging(files)
    target = h.producer("q", "queue")
    for i in range(300):
        tag = "yes" if i % 3 == 0 else "no"
        h.send(target, _tagged(i, tag), props={"k": tag})
    assert _pages(h).messages > 250
    picky = h.consumer("q", "queue", credit=0, selector="k = 'yes'")
    assert _drain(h, picky) == [f"message-{i:05d}" for i in range(0, 300, 3)]
    rest = _drain(h, h.consumer("q", "queue", credit=0))
    assert rest == [f"message-{i:05d}" for i in range(300) if i % 3]
    assert h.queue("q").message_count == 0


def test_a_paged_message_read_back_waits_its_redelivery_delay(files: PageFiles) -> None:
    """B-065 over B-151 (issue 23 audit: "redelivery delay behaves the same for paged
    messages"): a message that was paged, read back and delivered, then failed
    (modified delivery-failed), is scheduled for redelivery-delay while the others keep
    flowing, and comes back with its delivery count."""
    h = _paging(files, redelivery_delay=1_000)
    _send(h, 60)
    assert _pages(h).messages > 30
    c = h.consumer("q", "queue", credit=0)
    h.broker.set_credit(c, 40)
    batch = h.take(c)
    assert len(batch) == 40
    failed = batch[-1]  # paged at first: memory held about 20
    for d in batch[:-1]:
        h.broker.settle(c, d.delivery, ACCEPTED)
    h.broker.settle(c, failed.delivery, Modified(delivery_failed=True))
    h._collect()
    assert h.queue("q").scheduled_count == 1
    got = _drain(h, c)
    assert got == [f"message-{i:05d}" for i in range(40, 60)]
    h.advance(1_000)
    h.broker.set_credit(c, 10)
    [again] = h.take(c)
    assert _decode(again.message.data) == _decode(failed.message.data) == "message-00039"
    assert again.wire_count == 1


def test_retry_of_a_paged_dead_letter_queue_sends_everything_back_in_order(
    files: PageFiles,
) -> None:
    """B-161 retryMessages over B-151 (issue 23 audit: "management operations (...
    retry ...) behave the same for paged messages"): dead letters that paged in the
    dead-letter queue are all sent back to their queue by a retry, in order, and leave
    the dead-letter queue's page files."""
    h = _paging(files, dead_letter_address="DLA", max_delivery_attempts=1)
    h.producer("DLA", "queue")
    _send(h, 80)
    c = h.consumer("q", "queue", credit=0)
    while True:
        h.broker.set_credit(c, 20)
        batch = h.take(c)
        if not batch:
            break
        for d in batch:
            h.broker.settle(c, d.delivery, Rejected())
    dla = h.queue("DLA")
    assert dla.message_count == 80
    assert dla.pages is not None
    assert dla.pages.messages > 40
    assert ops.retry(h.broker, "DLA").retried == 80
    assert dla.message_count == 0
    assert dla.pages.messages == 0
    assert _drain(h, c) == [f"message-{i:05d}" for i in range(80)]


def test_priorities_apply_to_paged_messages_once_read_back(files: PageFiles) -> None:
    """B-013/B-014 over B-151 (issue 23 audit: "priorities ... behave the same for paged
    messages"; docs/decisions.md: they apply among the messages read back): paged
    high-priority messages, read back with the low ones ahead of them, go first."""
    h = _paging(files)
    target = h.producer("q", "queue")
    for i in range(40):
        h.send(target, _amqp(i), priority=9 if i >= 30 else 1)
    assert _pages(h).messages >= 15  # the high ones are all paged
    got = _drain(h, h.consumer("q", "queue", credit=0))
    assert got == [f"message-{i:05d}" for i in [*range(30, 40), *range(30)]]


def test_lifecycle_events_of_paged_messages_are_those_of_in_memory_ones(
    tmp_path: Path,
) -> None:
    """Issue 23 audit ("lifecycle events for paged messages are unchanged: the pipeline
    must not see a difference"): the same sends, rejections and drain on a queue that
    pages most of them and on one that holds everything in memory give the same events,
    field for field (one `enqueued` per message, not another when read back)."""

    def run(limit: int, directory: Path) -> tuple[int, list[object]]:
        files = PageFiles(directory, message_of=message_of, page_size_bytes=lambda a: 2_000)
        files.recover({}, {})
        h = Harness(
            {"#": AddressSettings.of(max_size_bytes=limit, dead_letter_address="DLA")},
            copier=COPIER,
        )
        h.broker.enable_paging(files)
        h.producer("DLA", "queue")
        h.broker.emitter.take()
        _send(h, 100)
        pages = h.queue("q").pages
        paged = pages.messages if pages is not None else 0
        c = h.consumer("q", "queue", credit=0)
        while True:
            h.broker.set_credit(c, 15)
            batch = h.take(c)
            if not batch:
                break
            for d in batch:
                outcome = Rejected() if d.message.msg_id % 7 == 0 else ACCEPTED
                h.broker.settle(c, d.delivery, outcome)
        events: list[object] = list(h.broker.emitter.take())
        files.close()
        return paged, events

    paged, events = run(LIMIT, tmp_path / "paged")
    assert paged > 70
    assert run(-1, tmp_path / "memory") == (0, events)
    assert sum(1 for e in events if getattr(e, "event", None) == "enqueued") >= 100


# B-151 PAGE over B-161 (issue 23 attack): management operations that take paged messages
# out of the page files (`remove_paged`) over a damaged page file. Before, `remove` walked
# the files without the read back's damage handling: a corrupt or unreadable page file
# raised out of the operation after the messages it took had been killed or moved (the
# HTTP API answered 500, and moved messages stayed in the page files: delivered twice).


def _damage_page(path: Path, how: str) -> None:
    if how == "directory":
        path.unlink()
        path.mkdir()
    else:  # a bit flipped inside the first frame's body: its checksum does not match
        data = bytearray(path.read_bytes())
        data[20] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["directory", "bit-flip"])
@pytest.mark.parametrize("operation", ["purge", "move"])
def test_a_filtered_operation_over_a_damaged_page_file_takes_each_message_once(
    files: PageFiles, how: str, operation: str, caplog: pytest.LogCaptureFixture
) -> None:
    h = _paging(files, max_read_page_bytes=LIMIT)
    h.producer("other", "queue")
    _send(h, 200)
    pages = _pages(h)
    paths = sorted(pages.directory.glob("*.page"))
    assert len(paths) > 4
    ids = [r.message.msg_id for r in ops.browse(h.broker, "q", limit=1_000)]
    # the messages of the second page file, before the damaged third one
    doomed = {ids[int(name[8:])] for _, _, name in _frames_of(pages, paths[1])}
    _damage_page(paths[2], how)
    if operation == "purge":
        taken = ops.purge(h.broker, "q", ids=doomed)
    else:
        taken = ops.move(h.broker, "q", to_queue="other", ids=doomed)
    assert taken == len(doomed)
    c = h.consumer("q", "queue", credit=0)
    got = _drain(h, c)
    assert pages.lost > 0  # met by the read back (a removal rewrites nothing: issue 23)
    assert "lost" in caplog.text
    taken_names = {f"message-{ids.index(i):05d}" for i in doomed}
    assert not taken_names & set(got)  # taken ones are gone from q: never twice
    assert len(got) == 200 - len(doomed) - pages.lost
    assert h.queue("q").message_count == 0
    if operation == "move":
        o = h.consumer("other", "queue", credit=0)
        assert sorted(_drain(h, o)) == sorted(taken_names)
    _send(h, 30, start=200)  # paging and reading back go on
    assert _drain(h, c) == [f"message-{i:05d}" for i in range(200, 230)]


@pytest.mark.parametrize("how", ["bit-flip", "zeros"])
def test_a_corrupt_page_file_before_the_last_loses_only_its_rest_at_a_restart(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """B-151 PAGE (issue 23 attack): the start-up scan treated damage in any page file as
    a torn tail: it truncated that file and deleted every later page file, so one flipped
    bit in an early file lost the whole backlog behind it. Now, as the read back: only the
    last file's tail is cut; damage before it loses the rest of that file only (logged),
    and every later message comes back in order."""
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 2_000)
    files.recover({}, {})
    pages = files.open(address="a", queue="q", durable=True)
    _fill(pages, range(200))
    files.close()
    paths = sorted(tmp_path.rglob("*.page"))
    assert len(paths) > 4
    frames = _frames_of(pages, paths[1])
    byte = frames[3][0]
    lost = {name for _, _, name in frames[3:]}
    data = bytearray(paths[1].read_bytes())
    if how == "bit-flip":
        data[byte + 12] ^= 0xFF
    else:  # a block of zeros in the middle of the file
        data[byte : byte + 64] = bytes(64)
    paths[1].write_bytes(bytes(data))
    reopened = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 2_000)
    assert reopened.recover({"q": "a"}, {}) == ["q"]
    again = reopened.open(address="a", queue="q", durable=True)
    assert all(path.exists() for path in paths)  # later files kept
    got = [_decode(m.data) for m in again.read(max_bytes=-1, max_messages=-1)]
    assert got == [f"message-{i:05d}" for i in range(200) if f"message-{i:05d}" not in lost]
    assert again.messages == 0
    assert paths[1].name in caplog.text
    reopened.close()


def test_a_browser_passes_a_damaged_page_file_and_logs_it_once(
    files: PageFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """B-031 over B-151 (issue 23 attack): a browser's walk stopped at a page file it
    could not read, for good: it never saw the messages behind it (which a consumer does
    get: the read back skips the damage), and every dispatch (each message routed to the
    queue) walked to it again and logged another error. Now a browser skips the damaged
    file as the read back does, and the error is logged once for that file."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 200)
    pages = _pages(h)
    paths = sorted(pages.directory.glob("*.page"))
    lost = {name for _, _, name in _frames_of(pages, paths[2])}
    paths[2].unlink()
    paths[2].mkdir()
    browser = h.consumer("q", "queue", credit=0, browse=True)
    seen = _browse_all(h, browser, credit=9)
    assert seen == [f"message-{i:05d}" for i in range(200) if f"message-{i:05d}" not in lost]
    h.broker.set_credit(browser, 1_000)
    for i in range(200, 250):  # each routed message is a dispatch: a walk to the end
        _send(h, 1, start=i)
    assert [_decode(d.message.data) for d in h.take(browser)] == [
        f"message-{i:05d}" for i in range(200, 250)
    ]
    errors = [r for r in caplog.records if r.levelname == "ERROR" and paths[2].name in r.message]
    assert len(errors) == 1


def test_a_non_matching_browsers_walk_is_a_step_per_loop_turn_while_a_producer_pages(
    files: PageFiles,
) -> None:
    """B-031 over B-151 (issue 23 attack): the browser's read step bounded one dispatch,
    but every message paged to the queue is a dispatch: a producer's burst of N messages
    in one loop turn walked N steps of the page files (a 256 KiB read of small messages:
    ~1,000 x 256 messages decoded in one turn). Now a browser that stopped at a step walks
    on only at the next loop turn (`tick`), however many dispatches come before it."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    target = h.producer("q", "queue")
    n = 8 * READ_STEP_MESSAGES
    for i in range(n):
        h.send(target, _tagged(i, "no"), props={"k": "no"})
    browser = h.consumer("q", "queue", credit=0, browse=True, selector="k = 'yes'")
    h.broker.set_credit(browser, 10)
    h._collect()
    mark = next(c for c in h.queue("q").consumers if c.browser).page_mark
    assert mark is not None
    assert mark.walking
    walked = mark.seen
    for i in range(n, n + 50):  # one loop turn: no tick between these
        h.send(target, _tagged(i, "yes"), props={"k": "yes"})
    assert mark.seen == walked  # the walk waits for the next turn
    _run_due(h)  # the turns go on: the walk reaches the matching messages
    h._collect()
    got = [_decode(d.message.data) for d in h.take(browser)]
    assert got == [f"message-{i:05d}" for i in range(n, n + 10)]


def test_a_drain_takes_paged_messages_beyond_the_read_limits_before_it_is_answered(
    files: PageFiles,
) -> None:
    """B-037/B-151 (issue 23 fix 1): with the queue's memory at max-read-page-bytes held
    by unsettled deliveries and paged messages left, a drain was answered "drained" (its
    credit spent on nothing) while messages waited on disk. A drain uses its credit for
    every available message first (AMQP 1.0 2.6.7): paged ones are read back for it,
    beyond the read limits, then it is answered once the queue has no more."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 200)
    c = h.consumer("q", "queue", credit=0)
    h.broker.set_credit(c, 150, drain=True)
    first = h.take(c)
    assert [_decode(d.message.data) for d in first] == [f"message-{i:05d}" for i in range(150)]
    assert h.drained == []  # its credit went on messages, not on a "drained"
    h.broker.set_credit(c, 100, drain=True)  # none settled yet: memory still full
    rest = h.take(c)
    assert [_decode(d.message.data) for d in rest] == [f"message-{i:05d}" for i in range(150, 200)]
    assert h.drained == [c]  # the queue had no more: answered
    for d in first + rest:
        h.broker.settle(c, d.delivery, ACCEPTED)
    assert h.queue("q").message_count == 0


def test_a_drain_without_a_drain_flag_still_keeps_the_read_limits(files: PageFiles) -> None:
    """Issue 23 fix 1, the other side (docs/decisions.md): a consumer that does not drain
    waits for memory to free (settles) as Artemis's read limits have it; and a drain
    whose selector takes none of a step read beyond the limits stops there (what no
    drainer takes never fills memory)."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 200)
    c = h.consumer("q", "queue", credit=150)
    got = h.take(c)
    assert 0 < len(got) < 40  # the read limit: about LIMIT of messages
    h.broker.set_credit(c, 0)
    picky = h.consumer("q", "queue", credit=0, selector="k = 'yes'")
    before = h.queue("q").memory_count
    h.broker.set_credit(picky, 100, drain=True)
    assert h.take(picky) == []
    assert picky in h.drained
    assert h.queue("q").memory_count - before <= READ_STEP_MESSAGES


def test_a_drain_waits_past_a_step_of_expired_paged_messages_for_the_live_ones(
    files: PageFiles,
) -> None:
    """B-084 + B-037 over B-151 (issue 23 fix 1): a read back step that found only
    expired paged messages (expired, not delivered) ended the drain although live ones
    followed on disk; the read back goes on a step a loop turn, and the drain is
    answered only once it has reached them."""
    h = _paging(files, expiry_address="EXP")
    h.producer("EXP", "queue")
    _send(h, 20)  # in memory
    expiring = 3 * READ_STEP_MESSAGES  # steps of nothing but expired ones
    _send(h, expiring, start=20, ttl_ms=1_000)  # paged, about to expire
    _send(h, 30, start=20 + expiring)  # paged, live
    h.clock.advance(2_000)
    c = h.consumer("q", "queue", credit=0)
    h.broker.set_credit(c, 100, drain=True)
    got = [_decode(d.message.data) for d in h.take(c)]
    for _ in range(20):
        if c in h.drained:
            break
        _run_due(h)
        got += [_decode(d.message.data) for d in h.take(c)]
    live = list(range(20)) + list(range(20 + expiring, 50 + expiring))
    assert got == [f"message-{i:05d}" for i in live]
    assert h.drained == [c]
    assert h.queue("q").counters.expired == expiring


@pytest.mark.parametrize("how", ["directory", "bit-flip"])
def test_a_purge_over_a_damaged_page_file_counts_its_part_as_lost(
    files: PageFiles, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """B-161 purge over B-151 (issue 23 fix 2): a purge without a filter browsed the page
    files (skipping a damaged file's rest) and then dropped the whole count: the
    messages the damage lost left the queue's count without being counted in `lost`.
    Now they are counted there (and logged), the others as killed, and the sum is what
    the queue counted."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 200)
    pages = _pages(h)
    paths = sorted(pages.directory.glob("*.page"))
    assert len(paths) > 4
    damaged = len(_frames_of(pages, paths[2]))
    _damage_page(paths[2], how)
    queue = h.queue("q")
    assert queue.message_count == 200
    purged = ops.purge(h.broker, "q")
    assert pages.lost == damaged  # the whole file: its first frame is the damaged one
    assert purged + pages.lost == 200
    assert queue.counters.killed == purged
    assert (queue.message_count, pages.messages, pages.size_bytes) == (0, 0, 0)
    assert "lost" in caplog.text
    _send(h, 30, start=200)  # paging and reading back go on
    c = h.consumer("q", "queue", credit=0)
    assert _drain(h, c) == [f"message-{i:05d}" for i in range(200, 230)]


class _Journal:
    """Keeps what is appended (the journal port `Persistence` writes to)."""

    def __init__(self) -> None:
        self.appended: list[Record] = []

    def on_resume(self, callback: object) -> None:
        pass

    def append(self, records: list[Record], *, sync: bool, on_durable: object = None) -> None:
        self.appended.extend(records)


def test_a_read_back_that_only_passed_a_damaged_page_file_journals_its_cursor(
    files: PageFiles,
) -> None:
    """B-151 + B-095 (issue 23 fix 4): a durable queue's read back journaled the page
    cursor only with messages read; one that met an unreadable page file, counted its
    messages lost and found nothing after it left the cursor before that file in the
    journal, so a restart met the damage again (and failed to start on it). Now the
    cursor is journaled whenever a read moves it."""
    h = Harness(
        {"#": AddressSettings.of(max_size_bytes=LIMIT, max_read_page_bytes=LIMIT)},
        copier=COPIER,
    )
    journal = _Journal()
    persistence = Persistence(journal)  # type: ignore[arg-type]
    h.broker.enable_persistence(persistence)
    h.broker.enable_paging(files)
    _send(h, 40, durable=True)
    persistence.flush()
    pages = _pages(h)
    paths = sorted(pages.directory.glob("*.page"))
    assert len(paths) == 1  # every paged message in one file
    assert pages.messages > 0
    paths[0].unlink()
    paths[0].mkdir()
    c = h.consumer("q", "queue", credit=0)
    got = _drain(h, c)
    persistence.flush()
    assert len(got) + pages.lost == 40
    cursors = [r for r in journal.appended if isinstance(r, PageCursor)]
    assert cursors, "the cursor past the skipped file was never journaled"
    assert (cursors[-1].page, cursors[-1].offset) == pages.position
    assert cursors[-1].page > int(paths[0].stem)


def test_the_oldest_waiting_age_sees_the_head_of_the_page_files(files: PageFiles) -> None:
    """Issue 24's oldest-message age over B-151 (issue 23 audit): with every message in
    memory delivered and not settled, a paged backlog was reported as "nothing waits"
    (no age). The head of the page files is what waits: its `first_ts`."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    _send(h, 40)
    first_paged = h.clock.now_ms()
    h.clock.advance(5_000)
    _send(h, 40, start=40)
    queue = h.queue("q")
    c = h.consumer("q", "queue", credit=100)
    assert h.take(c)  # memory's part, delivering
    assert _pages(h).messages > 0
    assert queue.oldest_waiting_ts() == first_paged


def test_the_artemis_persistent_size_counts_the_paged_part_as_the_message_count_does(
    files: PageFiles,
) -> None:
    """The Artemis plugin names over B-151 (issue 23 audit): `artemis_message_count`
    counted paged messages, `artemis_persistent_size` only the bytes held in memory (a
    queue of 1M paged messages showed the size of a few); Artemis's persistent size
    includes the paged part."""
    h = _paging(files)
    _send(h, 200)
    queue, pages = h.queue("q"), _pages(h)
    assert pages.messages > 100
    snapshot = BrokerSnapshot.take(h.broker, connections=0, connections_opened=0)
    text = render(BrokerCollector(lambda: snapshot, artemis_names=True)).decode()
    broker = h.broker.name
    series = f'artemis_persistent_size{{address="q",broker="{broker}",queue="q"}}'
    [line] = [line for line in text.splitlines() if line.startswith(series)]
    assert float(line.rsplit(" ", 1)[1]) == queue.size_bytes + pages.size_bytes


def test_a_drain_held_for_a_due_page_expiry_is_answered_when_there_is_nothing_to_read(
    files: PageFiles,
) -> None:
    """B-037 over B-084/B-151 (issue 23 audit of fix 1): a drain waits while a read back
    of paged messages is due (`Queue._reading_on`); when the expiry tick then found
    nothing to read (the expiring paged messages had been removed) it returned without a
    dispatch, and the drain was never answered. A consumer whose selector takes nothing
    now hears "drained" at that tick."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    target = h.producer("q", "queue")
    for i in range(20):
        h.send(target, _amqp(i))  # memory's part
    for i in range(20, 30):
        h.send(target, _tagged(i, "x"), ttl_ms=1_000, props={"k": "x"})  # paged, expiring
    for i in range(30, 60):
        h.send(target, _tagged(i, "no"), props={"k": "no"})  # paged, live
    assert ops.purge(h.broker, "q", selector="k = 'x'") == 10
    assert _pages(h).messages > 0
    h.clock.advance(2_000)  # the page expiry armed for them is due, not yet run
    picky = h.consumer("q", "queue", credit=0, selector="k = 'yes'")
    h.broker.set_credit(picky, 10, drain=True)
    _run_due(h)
    h.take(picky)
    assert picky in h.drained


def test_drains_over_paged_messages_due_later_leave_at_most_a_step_waiting_in_memory(
    files: PageFiles,
) -> None:
    """B-015 + B-037 over B-151 (issue 23 audit of fix 1): a drain reads beyond the read
    limits for its credit; paged messages with a delivery delay read back for it wait
    in memory (scheduled), so each drain round pulled its credit's worth more in, with
    no bound. Beyond the limits, what waits scheduled stays under a read step."""
    h = _paging(files, max_read_page_bytes=LIMIT)
    target = h.producer("q", "queue")
    for i in range(20):
        h.send(target, _amqp(i))  # memory's part
    for i in range(20, 2_020):
        h.send(target, _amqp(i), delivery_delay_ms=60_000)  # paged, due in a minute
    queue = h.queue("q")
    c = h.consumer("q", "queue", credit=0)
    for _ in range(10):
        h.broker.set_credit(c, 100, drain=True)
        h.take(c)
    assert c in h.drained
    assert queue.scheduled_count <= READ_STEP_MESSAGES + 100


@pytest.mark.timeout(20)
@pytest.mark.parametrize("number", [10**9, 10**30], ids=["gap-1e9", "past-i64"])
def test_a_page_file_numbered_far_ahead_is_taken_in_sequence(tmp_path: Path, number: int) -> None:
    """Issue 23 / issue 15 attack (a crafted data directory, B-151/B-153): the page files
    are walked page number by page number, so one file numbered 10^9 beside page 1 held
    the start in a billion `stat`s, and one past a Java long would have made the queue's
    journaled cursor unencodable. Files after a gap are renumbered to follow on; their
    messages come back in order after the others."""
    page = _write_durable(tmp_path, 3)
    ahead = page.parent / f"{number:012d}.page"
    ahead.write_bytes(page.read_bytes())
    pages = _reopen(tmp_path)
    assert pages.messages == 6
    assert not ahead.exists()
    got = pages.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in (*range(3), *range(3))]
    assert pages.position[0] < 2**63
    _fill(pages, range(3, 4))
    assert [_decode(m.data) for m in pages.read(max_bytes=-1, max_messages=-1)] == ["message-00003"]
    pages.close()


@pytest.mark.timeout(20)
def test_page_file_names_the_broker_never_writes_are_left_alone(tmp_path: Path) -> None:
    """Issue 15 attack (B-151): `1.page` and `0000000000001.page` read as page 1, which
    the broker reads from `000000000001.page`: counted twice, or a gap of a stray name.
    Only the names the broker writes are page files."""
    page = _write_durable(tmp_path, 3)
    for stray in ("1.page", "0000000000001.page", "7.page"):
        (page.parent / stray).write_bytes(page.read_bytes())
    pages = _reopen(tmp_path)
    assert pages.messages == 3
    assert pages.files == 1


@pytest.mark.timeout(20)
def test_page_files_far_ahead_of_a_journaled_cursor_follow_it(tmp_path: Path) -> None:
    """Issue 15 attack (B-151): the queue's only page file renumbered far ahead of its
    journaled cursor (its files before deleted by hand) is read from the cursor's
    next page, not searched for page by page."""
    page = _write_durable(tmp_path, 3)
    page.rename(page.parent / f"{10**20:012d}.page")
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    files.recover({"q": "a"}, {"q": (1, 40)})
    pages = files.open(address="a", queue="q", durable=True)
    assert pages.messages == 3
    got = pages.read(max_bytes=-1, max_messages=-1)
    assert [_decode(m.data) for m in got] == [f"message-{i:05d}" for i in range(3)]
    assert pages.position[0] == 2
    files.close()


def test_a_message_whose_address_a_page_frame_cannot_hold_is_refused_not_renamed(
    files: PageFiles,
) -> None:
    """Issue 15 attack (B-151): a page frame holds an address of up to 65,535 bytes; a
    longer one (an attach frame carries ~128 KiB) was cut there, mid-character, and the
    message was read back with another address. It is refused as not pageable; an
    address that fits comes back whole."""
    pages = files.open(address="a", queue="q", durable=False)
    fits, too_long = _durable(0), _durable(1)
    fits.address = "é" * 32_767  # 65,534 bytes
    too_long.address = "é" * 32_768
    pages.write(fits)
    with pytest.raises(ResourceLimitExceeded, match="address is over 65535 bytes"):
        pages.write(too_long)
    assert pages.messages == 1
    [back] = pages.read(max_bytes=-1, max_messages=-1)
    assert back.address == fits.address


def test_a_queue_made_non_destructive_over_paged_messages_is_named_at_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 23 (B-123 over B-151, docs/decisions.md): a queue the configuration made
    non-destructive across a restart, with paged messages, reads them back only as far
    as max-read-page-bytes allows (its messages never leave memory): the start warns,
    naming the queue and the count, rather than leaving its consumers short silently."""
    _write_durable(tmp_path, 20)
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 100_000)
    paged = files.recover({"q": "a"}, {})
    h = Harness({"#": AddressSettings.of(max_read_page_bytes=2_000)})
    h.broker.create_address("a", {RoutingType.ANYCAST})
    h.broker.create_queue(
        QueueConfig(name="q", address="a", routing_type=RoutingType.ANYCAST, non_destructive=True)
    )
    with caplog.at_level(logging.WARNING, logger="amqpbroker.core.broker"):
        h.broker.enable_paging(files, paged=tuple(paged))
    assert h.queue("q").pages.messages == 20
    assert "queue q is non-destructive and has 20 paged messages" in caplog.text
    files.close()
