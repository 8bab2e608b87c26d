"""Artemis `max-disk-usage` (core/diskguard.py; docs/decisions.md, docs/durability.md).

The user pass (2026-11-29) found that a journal which fills the disk leaves no room for
the acks that would free it: a restart brings drained messages back. Over the limit the
broker now refuses new durable sends (B-095's resource-limit-exceeded, the journal-failed
path's one `refuse_durable`) while acks, consumers and non-durable sends go on. No
sockets: an injected clock and an injected usage reader.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.core_harness import Harness, bodies

from amqpbroker.core import ACCEPTED, AddressSettings, ProducerTarget
from amqpbroker.core.diskguard import DiskFull, DiskGuard
from amqpbroker.core.errors import ResourceLimitExceeded
from amqpbroker.core.persistence import OnStored, Persistence
from amqpbroker.core.records import AckRef, Record
from amqpbroker.metrics.collector import BrokerCollector, BrokerSnapshot
from amqpbroker.store.journal import MemoryJournal

GiB = 1 << 30


class Recording(MemoryJournal):
    """A MemoryJournal that keeps what each append wrote, to see the acks written."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[Record] = []

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
    ) -> None:
        self.written.extend(records)
        super().append(records, sync=sync, on_durable=on_durable)


class Disk:
    """The injected usage reader: (used, total) as the test sets it."""

    def __init__(self, used: int, total: int = 10 * GiB) -> None:
        self.used, self.total = used, total
        self.reads = 0

    def __call__(self) -> tuple[int, int]:
        self.reads += 1
        return self.used, self.total


def _guarded(
    disk: Disk, *, percent: int = 90, period_ms: int = 5_000
) -> tuple[Harness, Persistence, Recording, DiskGuard]:
    h = Harness()
    journal = Recording()
    persistence = Persistence(journal)
    h.broker.enable_persistence(persistence)
    guard = DiskGuard(
        max_usage_percent=percent,
        period_ms=period_ms,
        read_usage=disk,
        persistence=persistence,
        now_ms=h.clock.now_ms(),
    )
    h.broker.disk_guard = guard
    persistence.note_written = guard.note_written  # as server.py wires it
    return h, persistence, journal, guard


def _send(h: Harness, target: ProducerTarget, body: bytes, persistence: Persistence) -> None:
    h.send(target, body, durable=True)
    persistence.flush()


def test_over_max_disk_usage_durable_sends_are_refused_and_acks_still_written() -> None:
    """The user pass's loop, broken: over the limit a durable send is refused with
    resource-limit-exceeded, a non-durable one flows, a consumer drains what was stored
    and its acks reach the journal (the room the limit kept), and once usage falls the
    next check takes durable sends again without a restart."""
    disk = Disk(used=5 * GiB)
    h, persistence, journal, guard = _guarded(disk)
    target = h.producer("q", "queue")
    h.advance(0)  # the first check, on the first tick: under the limit
    assert disk.reads == 1
    assert not guard.full
    _send(h, target, b"stored", persistence)
    disk.used = 9 * GiB + GiB // 2  # 95% > 90%
    h.advance(4_999)
    assert disk.reads == 1  # not before disk-scan-period
    h.advance(1)
    assert guard.full
    assert guard.ratio == pytest.approx(0.95)
    with pytest.raises(ResourceLimitExceeded, match="max-disk-usage 90%"):
        h.send(target, b"refused", durable=True)
    h.send(target, b"volatile")  # non-durable: in memory, no disk needed
    c = h.consumer("q", "queue")
    dispatches = h.take(c)
    assert bodies(dispatches) == [b"stored", b"volatile"]
    for d in dispatches:
        h.settle(c, d, ACCEPTED)
    persistence.flush()
    stored_id = dispatches[0].message.msg_id
    assert AckRef(queue="q", msg_id=stored_id) in journal.written  # the ack has its room
    assert h.queue("q").message_count == 0
    disk.used = 8 * GiB
    h.advance(5_000)
    assert not guard.full
    assert persistence.refusing is None
    _send(h, target, b"after", persistence)  # accepted again, same producer
    assert bodies(h.take(c)) == [b"after"]


def test_a_transactional_send_is_checked_by_the_same_policy() -> None:
    """B-141 `check_publish` (a transaction's sends) refuses as `publish` does: one
    policy, `refuse_durable`, for the journal's failure and the disk's usage alike."""
    disk = Disk(used=10 * GiB)  # 100%
    h, _, _, _ = _guarded(disk)
    h.advance(0)
    target = h.producer("q", "queue")
    with pytest.raises(ResourceLimitExceeded, match="cannot store durable messages"):
        h.broker.check_publish(target, durable=True)
    h.broker.check_publish(target, durable=False)  # not durable: fine


def test_one_warning_when_it_starts_one_info_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A check that finds the disk still over the limit says nothing more (Artemis logs
    AMQ222210 once per crossing)."""
    disk = Disk(used=10 * GiB)
    h, _, _, _ = _guarded(disk, period_ms=1_000)
    with caplog.at_level(logging.INFO, logger="amqpbroker.core.broker"):
        for _ in range(3):
            h.advance(1_000)
        disk.used = GiB
        for _ in range(3):
            h.advance(1_000)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "max-disk-usage" in r.msg]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO]
    assert "beyond max-disk-usage 90%" in said[0][1]
    assert "AMQ222210" in said[0][1]
    assert disk.reads == 6


@pytest.mark.parametrize(
    ("percent", "used", "over"),
    [
        (0, 1, True),
        (0, 0, False),
        (90, 9 * GiB, False),
        (90, 9 * GiB + 1, True),
        (100, 10 * GiB, False),
    ],
)
def test_over_means_above_the_percent_as_artemis(percent: int, used: int, over: bool) -> None:
    """`usage > max-disk-usage`: 0 refuses durable sends while anything is on the file
    system (every real disk), 100 never does (docs/decisions.md)."""
    disk = Disk(used=used)
    _, persistence, _, guard = _guarded(disk, percent=percent)
    guard.check(0)
    assert guard.full is over
    assert isinstance(persistence.refusing, DiskFull) is over


def test_journal_failure_and_disk_full_each_keep_refusing_until_both_end() -> None:
    """Either cause refuses; the end of one does not take durable sends while the other
    holds (a journal resumed on a disk still over the limit, or the reverse)."""
    disk = Disk(used=10 * GiB)
    h, persistence, _, guard = _guarded(disk)
    target = h.producer("q", "queue")
    guard.check(0)
    persistence._failed(OSError(28, "No space left on device"))
    persistence.resumed()  # the journal's probe found room
    with pytest.raises(ResourceLimitExceeded, match="max-disk-usage"):
        h.send(target, b"x", durable=True)
    persistence._failed(OSError(28, "No space left on device"))
    disk.used = 0
    guard.check(10_000)  # under again, but the journal still fails
    with pytest.raises(ResourceLimitExceeded, match="No space left"):
        h.send(target, b"y", durable=True)
    persistence.resumed()
    _send(h, target, b"z", persistence)
    assert h.queue("q").message_count == 1


def test_an_unreadable_disk_keeps_the_last_answer() -> None:
    """A reader that fails (the data directory removed under the broker) changes
    nothing and is tried again a period later."""
    disk = Disk(used=10 * GiB)
    h, persistence, _, guard = _guarded(disk, period_ms=100)

    def fails() -> tuple[int, int]:
        raise FileNotFoundError("gone")

    guard.check(0)
    guard._read_usage = fails
    guard.check(100)
    assert guard.full
    assert persistence.refusing is not None
    assert h.broker.next_deadline_ms() == 200


def _gauges(h: Harness) -> dict[str, float]:
    def snapshot() -> BrokerSnapshot:
        return BrokerSnapshot.take(h.broker, connections=0, connections_opened=0)

    collector = BrokerCollector(snapshot, artemis_names=False)
    samples: Iterable[tuple[str, float]] = (
        (s.name, s.value) for family in collector.collect() for s in family.samples
    )
    return {name: value for name, value in samples if name.startswith("amqpbroker_disk_")}


def test_metrics_show_the_usage_and_whether_sends_are_refused() -> None:
    disk = Disk(used=10 * GiB)
    h, _, _, guard = _guarded(disk)
    assert _gauges(Harness()) == {}  # no check (no persistence, or -1): no gauges
    guard.check(0)
    assert _gauges(h) == {"amqpbroker_disk_usage_ratio": 1.0, "amqpbroker_disk_full": 1.0}
    disk.used = GiB
    guard.check(5_000)
    assert _gauges(h) == {"amqpbroker_disk_usage_ratio": 0.1, "amqpbroker_disk_full": 0.0}


def test_a_full_page_address_refuses_what_it_would_page_while_over_the_limit(
    tmp_path: Path,
) -> None:
    """B-151 PAGE: page files would take the room kept for acks, so while the disk is
    over max-disk-usage a full PAGE address refuses non-durable sends too (the one
    address-full refusal, `_refusal`), and takes them again under the limit; an address
    with room is not affected."""
    from proton import Message as ProtonMessage

    disk = Disk(used=GiB)
    with _paging(tmp_path, disk, page_bytes=2_000) as (h, guard):
        target = h.producer("q", "queue")
        body = bytes(ProtonMessage(body="x" * 200).encode())
        guard.check(0)  # under the limit: the address fills, then pages
        h.send(target, body)
        queue = h.queue("q")
        while queue.pages is None or not queue.pages.messages:
            h.send(target, body)
        paged = queue.pages.messages
        disk.used = 10 * GiB
        guard.check(5_000)
        with pytest.raises(ResourceLimitExceeded, match="is full and cannot page"):
            h.send(target, body)
        assert queue.pages.messages == paged
        disk.used = GiB
        guard.check(10_000)
        h.send(target, body)  # pages again
        assert queue.pages.messages == paged + 1


def _persistence(h: Harness) -> Persistence:
    persistence = Persistence(Recording())
    h.broker.enable_persistence(persistence)
    return persistence


@contextmanager
def _paging(tmp_path: Path, disk: Disk, *, page_bytes: int) -> Iterator[tuple[Harness, DiskGuard]]:
    """A broker whose addresses page past 1,000 bytes into page files of `page_bytes`
    under `tmp_path`, with persistence and a guard (90%, 5 s) reading `disk`. The
    protocol's parts are imported here: the core's other tests load no proton."""
    from amqpbroker.protocol import message_of
    from amqpbroker.protocol.moves import COPIER
    from amqpbroker.store.paging import PageFiles

    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: page_bytes)
    files.recover({}, {})
    try:
        h = Harness({"#": AddressSettings.of(max_size_bytes=1_000)}, copier=COPIER)
        h.broker.enable_paging(files)
        guard = DiskGuard(
            max_usage_percent=90,
            period_ms=5_000,
            read_usage=disk,
            persistence=_persistence(h),
            now_ms=0,
        )
        yield h, guard
    finally:
        files.close()


def test_writes_between_scans_refuse_as_soon_as_the_estimate_crosses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """max-disk-usage between scans: a scan every disk-scan-period let a fast producer
    fill the disk within one period. The guard adds what each journal append wrote since
    the last scan to the usage measured then: the send after the estimate crosses the
    limit is refused at once (no scan yet), the next tick rescans, and the measurement
    decides from then on (one warning for the crossing, none when the scan confirms it)."""
    disk = Disk(used=895_000, total=1_000_000)  # 89.5%; the limit allows 900,000
    h, persistence, _, guard = _guarded(disk)
    target = h.producer("q", "queue")
    h.advance(0)  # the first scan: under the limit
    assert not guard.full
    body = b"x" * 1_000
    sent = 0
    with caplog.at_level(logging.INFO, logger="amqpbroker.core.broker"):
        while not guard.full:
            _send(h, target, body, persistence)  # each append: ~1,064 bytes estimated
            sent += 1
        assert sent == 5  # 895,000 + 5 x ~1.1 KB > 900,000
        assert disk.reads == 1  # no scan: the estimate decided
        with pytest.raises(ResourceLimitExceeded, match="max-disk-usage 90%"):
            h.send(target, body, durable=True)
        assert h.broker.next_deadline_ms() == 0  # a rescan at the next tick
        disk.used = 901_000  # what the writes really took
        h.advance(0)
        assert disk.reads == 2
        assert guard.full  # the measurement agrees: still refused, no second warning
        assert guard.next_check_ms == h.clock.now_ms() + 5_000
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "estimated from what was written since the last scan" in warnings[0]


def test_an_estimate_the_scan_does_not_confirm_takes_sends_again() -> None:
    """The estimate counts bytes written, not blocks allocated (a journal may write over
    space it holds): when the rescan it asked for measures less, the measurement wins
    and the estimate starts again from it."""
    disk = Disk(used=899_000, total=1_000_000)
    h, persistence, _, guard = _guarded(disk)
    target = h.producer("q", "queue")
    h.advance(0)
    _send(h, target, b"x" * 2_000, persistence)
    assert guard.full
    h.advance(0)  # the rescan: the disk did not grow
    assert not guard.full
    assert persistence.refusing is None
    assert guard.written_bytes == 0
    _send(h, target, b"y", persistence)  # accepted; the estimate is 899,000 + ~70
    assert not guard.full


def test_no_estimate_refuses_when_the_limit_never_does() -> None:
    """max-disk-usage 100 never refuses (Artemis), not even on an estimate past the total
    (-1 builds no guard: server.py)."""
    disk = Disk(used=999_000, total=1_000_000)
    guard = DiskGuard(
        max_usage_percent=100,
        period_ms=5_000,
        read_usage=disk,
        persistence=Persistence(Recording()),
        now_ms=0,
    )
    guard.check(0)
    guard.note_written(10_000_000)
    assert not guard.full


def test_page_writes_count_toward_the_estimate(tmp_path: Path) -> None:
    """B-151 PAGE: page files take disk as the journal does; what is paged between
    scans counts toward the estimate, and crossing it refuses what would page."""
    from proton import Message as ProtonMessage

    disk = Disk(used=895_000, total=1_000_000)
    with _paging(tmp_path, disk, page_bytes=100_000) as (h, guard):
        h.broker.disk_guard = guard
        guard.check(0)
        target = h.producer("q", "queue")
        body = bytes(ProtonMessage(body="x" * 500).encode())
        queue = h.queue("q") if "q" in h.broker.queues else None
        while queue is None or queue.pages is None or not queue.pages.messages:
            h.send(target, body)
            queue = h.queue("q")
        assert guard.written_bytes > 0  # the page write, counted
        for _ in range(20):  # ~520 bytes each: ~5,000 bytes of room
            if guard.full:
                break
            h.send(target, body)
        assert guard.full
        with pytest.raises(ResourceLimitExceeded, match="is full and cannot page"):
            h.send(target, body)
        assert disk.reads == 1  # refused on the estimate, before any rescan
