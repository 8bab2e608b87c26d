"""B-151 PAGE (issue 23 item 2): a core broker paging to real page files in a temporary
directory (`store/paging.py`), driven like the adapter drives it (`Harness`)."""

from __future__ import annotations

import contextlib
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings
from amqpbroker.core import operations as ops
from amqpbroker.core.model import Message
from amqpbroker.core.outcomes import Accepted, Rejected
from amqpbroker.protocol import message_of
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
    h = Harness({"#": AddressSettings.of(max_size_bytes=LIMIT, **settings)})
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
